import atexit
import copy
import os
import shutil
import tempfile

import pytest
import torch

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if os.environ.get("SPARSERL_TEST_DEVICE", "cpu") == "cpu":
    # Triton's kernels (sparserl.rollout.gpu) run in its interpreter on CPU tensors; it is chosen when triton and
    # the kernels are imported, so it is set before anything imports them (test_gpu_compile runs apart without it)
    os.environ.setdefault("TRITON_INTERPRET", "1")

#: where the suite's caches live: the folder ``$SPARSERL_TEST_CACHE`` names, else a temporary folder made
#: here (``<tmp>/sparserl-test-caches/session-<pid>-*``) and removed when the process that made it exits.
#: The pytest-xdist controller imports this file before it starts its workers, which inherit the variable:
#: one folder for the whole session, so the embedded model converts once per session, not once per worker.
TEST_CACHE_ENV = "SPARSERL_TEST_CACHE"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _temporary_caches() -> str:
    """Point every cache the code writes (``$SPARSERL_CACHE``: the embedded model's Hugging Face folder,
    ~520 MB; ``$SPARSERL_NATIVE_CACHE``: the native kernels and the dtype-auto / mixed-precision
    measurements) at the session's folder, so the suite never reads or writes the user's
    ``~/.cache/sparserl``. Set at import, before collection: test modules build the native kernels in
    their ``skipif`` marks. The folders of sessions whose process is gone (killed before its exit handler
    ran) are removed here."""
    root = os.environ.get(TEST_CACHE_ENV, "").strip()
    if not root:
        parent = os.path.join(tempfile.gettempdir(), "sparserl-test-caches")
        os.makedirs(parent, exist_ok=True)
        for name in os.listdir(parent):
            pid = name.split("-")[1] if name.startswith("session-") else ""
            if pid.isdigit() and not _alive(int(pid)):
                shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
        root = tempfile.mkdtemp(prefix=f"session-{os.getpid()}-", dir=parent)
        os.environ[TEST_CACHE_ENV] = root
        atexit.register(shutil.rmtree, root, ignore_errors=True)
    os.environ["SPARSERL_CACHE"] = root
    os.environ["SPARSERL_NATIVE_CACHE"] = os.path.join(root, "native")
    return root


def _native_kernels_once(root: str) -> None:
    """Under pytest-xdist the workers share the session's folder and each collects the test modules,
    which build the native kernels: the first worker here builds them while the others wait on a lock,
    then find the library built, instead of each compiling the same one at the same time."""
    import fcntl

    from sparserl.rollout import native

    with open(os.path.join(root, ".native.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        native.library()


TEST_CACHE = _temporary_caches()
if os.environ.get("PYTEST_XDIST_WORKER"):
    _native_kernels_once(TEST_CACHE)

torch.set_num_threads(min(2, torch.get_num_threads()))

SHARED_DATA = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data")
# Where the session's tiny model lives: ``cpu`` (CI), or ``cuda`` on a GPU machine, which runs the
# engine's matrices (compressors, replay, KV and weight quantization) on CUDA (experiments/device/cuda_check.sh).
TEST_DEVICE = os.environ.get("SPARSERL_TEST_DEVICE", "cpu")


@pytest.fixture(scope="session")
def tiny():
    """A seeded random Llama of SmolLM2's family and tokenizer (float32), on ``SPARSERL_TEST_DEVICE``."""
    from sparserl.models.loading import load_model

    return load_model("tiny", dtype="float32", seed=0, device=TEST_DEVICE)


#: the final norm's weight times this in :func:`peaked`: logits x20, mean next-token entropy ~1.6 nats
#: instead of the tiny model's log(vocab) = 10.8 (a trained model's is a few nats at most)
PEAK = 20.0


@pytest.fixture(scope="session")
def peaked(tiny):
    """The tiny model (a copy, as a LoadedModel on the same tokenizer) with its final norm scaled by
    :data:`PEAK`: peaked next-token distributions. The tiny model's own are nearly uniform, where any two
    samplers agree (α near 1, log-probs within a few hundredths): a sampler whose logits are scaled by
    0.7 passes a tolerance there, and fails it here."""
    from sparserl.models.loading import LoadedModel

    hf = copy.deepcopy(tiny.model)
    with torch.no_grad():
        hf.model.norm.weight.mul_(PEAK)
    return LoadedModel(hf.eval(), tiny.tokenizer, "tiny-peaked", None)


@pytest.fixture(scope="session")
def tiny_family(tiny):
    """``tiny_family(name)``: a seeded random 2-layer model of another family (``qwen2``, ``qwen3``,
    ``mistral``) on the tiny model's tokenizer, as a LoadedModel."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from sparserl.models.loading import LoadedModel

    def build(family: str) -> LoadedModel:
        cfg = AutoConfig.for_model(
            family,
            vocab_size=len(tiny.tokenizer),
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            max_position_embeddings=512,
            eos_token_id=tiny.tokenizer.eos_token_id,
            tie_word_embeddings=False,
        )
        torch.manual_seed(0)
        return LoadedModel(AutoModelForCausalLM.from_config(cfg).eval(), tiny.tokenizer, family, None)

    return build


@pytest.fixture(scope="session")
def avx2_build():
    """The native kernels built for plain AVX2 (no AVX512, no VNNI), to compare with the
    ``-march=native`` build bit for bit; skips where this CPU cannot run that code or no compiler."""
    from pathlib import Path

    from sparserl.rollout import native

    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    if native.library() is None or not all(f" {f}" in flags for f in ("avx2", "fma", "f16c")):
        pytest.skip("no AVX2/FMA/F16C CPU or no C compiler")
    return native.load(native.build(flags=native.flags_for("-mavx2 -mfma -mf16c")))


@pytest.fixture(scope="session")
def avx_vnni_build():
    """The native kernels built for AVX2 + AVX-VNNI without AVX512 (a laptop's 256-bit VNNI: the
    int8 tiles' vpdpbusd on 32 bytes); skips where this CPU has no AVX-VNNI or no compiler."""
    from pathlib import Path

    from sparserl.rollout import native

    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    if native.library() is None or not all(f" {f}" in flags for f in ("avx2", "fma", "f16c", "avx_vnni")):
        pytest.skip("no AVX-VNNI CPU or no C compiler")
    return native.load(native.build(flags=native.flags_for("-mavx2 -mfma -mf16c -mavxvnni")))


def _generate_fused(engine, *args, **kw):
    """``engine.generate(*args, **kw)`` with the fused decode step, asserting that every decode step ran it."""
    from sparserl.rollout import fused

    calls, real = [], fused.decode_layers

    def counted(*a, **k):
        out = real(*a, **k)
        calls.append(out is not None)
        return out

    fused.decode_layers = counted
    try:
        engine.fused = True
        out = engine.generate(*args, **kw)
    finally:
        fused.decode_layers = real
    assert calls and all(calls)
    return out


@pytest.fixture
def generate_fused():
    """:func:`_generate_fused`: generate on the fused step, which must run at every decode step."""
    return _generate_fused
