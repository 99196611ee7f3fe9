"""OpenVINO GenAI as a peer of ``sparserl bench rollout`` (``--peers openvino``).

Two rows of the same JSON, ``engine: "openvino"``, run by OpenVINO GenAI's
``ContinuousBatchingPipeline`` (its CPU engine: paged KV cache, built-in KV eviction, and the
log-prob of each sampled token, as an RL sampler needs):

- ``compressor: "none"``: dense;
- ``compressor: "eviction"``: its cache eviction (``CacheEvictionConfig``) at the bench's budget.
  Its sizes must be multiples of the KV block (32 tokens on the CPU): ``max_cache_size`` is the
  budget rounded up to a block (256 → 256); ``start_size`` and ``recent_size`` are one block each,
  the least it allows, so the scored (evictable) area is as large as it can be, as in our R-KV whose
  protected recent window is 8 tokens. Scores aggregate by ``SUM`` of the attention a token
  received (H2O's rule). Its adaptive R-KV mode is not used: with the pinned OpenVINO GenAI it
  crashes at the first eviction on the CPU. The cache counts the prompt; only full blocks are
  evicted, so a sequence holds at most ``max_cache_size + 31`` tokens.

Like with like: the same chat-templated prompt ids as the sparserl rows (passed as ids, no
tokenization in the timing), the same batch, sampling at temperature 1 with no top-k/top-p filter,
exactly ``max_new_tokens`` per sequence (``min_new_tokens`` = ``max_new_tokens``, ``ignore_eos``),
log-probs returned (``logprobs=1``), the same precision on both sides (``INFERENCE_PRECISION_HINT``
and ``KV_CACHE_PRECISION`` set to the bench's dtype: f32 for float32, whatever the CPU's default
would be), as many threads as torch uses, no prefix caching (every sequence prefills its prompt, as
ours do). Tokens/s = tokens generated / wall time of one ``generate`` call over the batch (prefill
included), as for the sparserl rows.

KV bytes: ``kv_bytes_peak`` is what the pipeline allocated for its KV cache, read from its metrics
(``PipelineMetrics.kv_cache_size_in_bytes``); ``kv_bytes_theory`` is computed: batch × bytes per
token × the most tokens a sequence holds (prompt + new tokens, dense; at most
``max_cache_size + 31`` with eviction).

Set-up, once: ``sparserl bench setup-openvino`` (:mod:`sparserl.bench.openvino_setup`) installs the
runtime (the ``bench`` extra) into this environment and optimum-intel's exporter into an environment of
its own, with its own pins. The model is converted to OpenVINO IR once and cached under
``$SPARSERL_CACHE/openvino/<model>-<weight format>/`` (default ``~/.cache/sparserl/openvino/``) by
that exporter (``$SPARSERL_OPENVINO_EXPORT_PYTHON`` names another Python with optimum-intel instead).
docs/results/bench_openvino.md has the measured side-by-side.
"""

from __future__ import annotations

import atexit
import hashlib
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from ..models.loading import DEFAULT_MODEL, cache_dir
from .measure import Row, Run
from .openvino_setup import SETUP_COMMAND, OpenVINOSetupError, check_ready, exporter_python
from .roofline import mean_kv_tokens

KV_BLOCK = 32  # OpenVINO's CPU KV-cache block size: eviction sizes are multiples of it
#: the bench's dtype → OpenVINO's element type for inference and KV cache, and the IR's weight format
PRECISION = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}
WEIGHT_FORMAT = {"float32": "fp32", "bfloat16": "fp32", "float16": "fp16"}

#: run by the exporter's Python: optimum-intel's exporter, IR weights in ``weight_format``, and the
#: tokenizer/detokenizer IR the pipeline loads. optimum-intel 2.2.0 imports, at package import,
#: vision-language classes that transformers >= 5.6 no longer has; the text-generation export never
#: uses them, so when that import fails the module is replaced by empty stand-ins and the import retried.
_EXPORT_SCRIPT = """
import sys, types
try:
    from optimum.exporters.openvino import main_export
    from optimum.intel import OVConfig
except (ImportError, AttributeError):
    for name in [m for m in sys.modules if m.startswith("optimum.intel")]:
        del sys.modules[name]
    vlm = types.ModuleType("optimum.intel.openvino.modeling_visual_language")
    for cls in ("OVModelForVisualCausalLM", "OVModelForMultimodalLM", "OVVisionEmbedding"):
        setattr(vlm, cls, type(cls, (), {}))
    vlm.MODEL_TYPE_TO_CLS_MAPPING = {}
    sys.modules[vlm.__name__] = vlm
    from optimum.exporters.openvino import main_export
    from optimum.intel import OVConfig
src, out, weight_format = sys.argv[1:4]
main_export(src, output=out, task="text-generation-with-past", ov_config=OVConfig(dtype=weight_format),
            convert_tokenizer=True, library_name="transformers", local_files_only=True)
"""


#: run by the exporter's Python: NNCF's int8 weight compression of a converted IR (symmetric, per output
#: channel, every MatMul and the embedding; OpenVINO's CPU plugin then quantizes the activations
#: dynamically), the tokenizer files copied beside it.
_INT8_SCRIPT = """
import shutil, sys
import nncf, openvino as ov
src, out = sys.argv[1:3]
shutil.copytree(src, out, dirs_exist_ok=True)
model = nncf.compress_weights(ov.Core().read_model(src + "/openvino_model.xml"), mode=nncf.CompressWeightsMode.INT8_SYM)
ov.save_model(model, out + "/openvino_model.xml")
"""


class PeerUnavailable(Exception):
    """The peer cannot run here (not set up, or its model cannot be converted); the message says
    how to make it run. :func:`~sparserl.bench.rollout.run_bench` goes on without its rows; the
    command checks :func:`check_peer` first and stops with the message instead."""


def import_openvino_genai():
    try:
        import openvino_genai
    except ImportError as e:
        raise PeerUnavailable(
            f"OpenVINO peer skipped: openvino-genai is not importable ({e}); run `{SETUP_COMMAND}`"
        ) from None
    return openvino_genai


def eviction_sizes(kv_budget: int, block: int = KV_BLOCK) -> dict:
    """OpenVINO's cache-eviction sizes for a budget (see the module docstring for the choice); at
    least three blocks (start, recent and one evictable block)."""
    max_size = -(-kv_budget // block) * block
    max_size = max(max_size, 3 * block)  # start + recent + at least one evictable block
    return {"start_size": block, "recent_size": block, "max_cache_size": max_size}


def _model_key(model: str) -> str:
    if model in (DEFAULT_MODEL, "default", "smollm2"):
        return DEFAULT_MODEL
    p = Path(model).expanduser().resolve()
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", p.stem or p.name) or "model"
    return f"{stem}-{hashlib.sha1(str(p).encode()).hexdigest()[:8]}"


def ir_folder(model: str, dtype: str) -> Path | None:
    """Where ``model``'s IR in ``dtype``'s weight format is cached (None for ``tiny``: converted into a
    temporary folder every time, its weights depend on the seed)."""
    if model == "tiny":
        return None
    return cache_dir() / "openvino" / f"{_model_key(model)}-{WEIGHT_FORMAT[dtype]}"


def _converted(folder: Path | None) -> bool:
    return (
        folder is not None and (folder / "openvino_model.xml").exists() and (folder / "openvino_tokenizer.xml").exists()
    )


def check_peer(model: str, dtype: str) -> None:
    """Before anything loads: the runtime imports, and the model is converted already or an exporter is
    set up; else :class:`~sparserl.bench.openvino_setup.OpenVINOSetupError` naming the set-up command.
    The int8 row's NNCF compression needs the exporter too."""
    check_ready(need_exporter=not _converted(ir_folder(model, dtype)))


def converted_model(lm, model: str, dtype: str, log=print) -> Path:
    """The OpenVINO IR folder of ``lm`` (converted once and cached; ``tiny`` is converted into a
    temporary folder every time, its weights depend on the seed)."""
    fmt = WEIGHT_FORMAT[dtype]
    target = ir_folder(model, dtype)
    if target is None:
        scratch = tempfile.mkdtemp(prefix="sparserl-ov-tiny-")
        atexit.register(shutil.rmtree, scratch, True)
        target = Path(scratch) / f"tiny-{fmt}"
    if _converted(target):
        return target
    python = _exporter()
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        src = lm.path
        if src is None:  # no Hugging Face folder behind it (tiny, a GGUF file): write one
            src = work / "hf"
            lm.model.save_pretrained(src)
            lm.tokenizer.save_pretrained(src)
        log(f"openvino: converting {model} to OpenVINO IR ({fmt}) with {python} -> {target} (once)")
        t = time.perf_counter()
        proc = subprocess.run(
            [python, "-c", _EXPORT_SCRIPT, str(src), str(work / "ir"), fmt], capture_output=True, text=True
        )
        if proc.returncode != 0:
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
            raise PeerUnavailable(
                f"OpenVINO peer skipped: converting {model} with optimum-intel failed ({python}, exit "
                f"{proc.returncode}; `{SETUP_COMMAND} --force` rebuilds the exporter). Its last lines:\n{tail}"
            )
        if target.exists():
            shutil.rmtree(target)
        (work / "ir").rename(target)
        log(f"openvino: converted in {time.perf_counter() - t:.0f}s")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


def _exporter() -> str:
    try:
        return str(exporter_python())
    except OpenVINOSetupError as e:
        raise PeerUnavailable(f"OpenVINO peer skipped: {e}") from None


def int8_model(folder: Path, log=print) -> Path:
    """``folder``'s IR with int8 weights (NNCF ``INT8_SYM``, per channel), converted once beside it."""
    target = folder.with_name(folder.name + "-int8")
    if (target / "openvino_model.xml").exists():
        return target
    python = _exporter()
    work = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        log(f"openvino: compressing the weights of {folder.name} to int8 with NNCF -> {target} (once)")
        proc = subprocess.run(
            [python, "-c", _INT8_SCRIPT, str(folder), str(work / "ir")], capture_output=True, text=True
        )
        if proc.returncode != 0:
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
            raise PeerUnavailable(
                f"OpenVINO int8 row skipped: NNCF weight compression failed ({python}, exit "
                f"{proc.returncode}; it needs nncf, installed with optimum-intel). Its last lines:\n{tail}"
            )
        if target.exists():
            shutil.rmtree(target)
        (work / "ir").rename(target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


def openvino_rows(
    lm,
    model: str,
    dtype: str,
    batch: int,
    max_new_tokens: int,
    kv_budget: int,
    prompt_ids: list[int],
    kv_bytes_per_token: int,
    threads: int,
    seed: int = 0,
    quants: tuple | list = ("none",),
    log=print,
) -> list[Row]:
    """The OpenVINO rows (dense, eviction, and with ``int8`` in ``quants`` dense on int8 weights) of
    a bench; raises :class:`PeerUnavailable`."""
    ov_genai = import_openvino_genai()
    import numpy as np
    import openvino as ov

    folder = converted_model(lm, model, dtype, log)
    precision = PRECISION[dtype]
    properties = {
        "INFERENCE_PRECISION_HINT": precision,
        "KV_CACHE_PRECISION": precision,
        "INFERENCE_NUM_THREADS": threads,
    }
    P, L = len(prompt_ids), max_new_tokens
    ids = ov.Tensor(np.asarray([prompt_ids], dtype=np.int64))
    configs = []
    for i in range(batch):
        cfg = ov_genai.GenerationConfig()
        cfg.do_sample, cfg.temperature, cfg.top_p = True, 1.0, 1.0
        cfg.max_new_tokens = cfg.min_new_tokens = L
        cfg.ignore_eos = True
        cfg.logprobs = 1
        cfg.rng_seed = seed + i
        configs.append(cfg)
    warm_up = ov_genai.GenerationConfig()
    warm_up.do_sample, warm_up.max_new_tokens, warm_up.min_new_tokens, warm_up.ignore_eos = True, 4, 4, True

    def pipeline(eviction: dict | None, ir: Path = folder):
        sc = ov_genai.SchedulerConfig()
        sc.enable_prefix_caching = False
        sc.max_num_seqs = max(batch, sc.max_num_seqs)
        if eviction is not None:
            sc.use_cache_eviction = True
            sc.cache_eviction_config = ov_genai.CacheEvictionConfig(
                eviction["start_size"],
                eviction["recent_size"],
                eviction["max_cache_size"],
                ov_genai.AggregationMode.SUM,
            )
        return ov_genai.ContinuousBatchingPipeline(str(ir), sc, "CPU", properties)

    def row(compressor: str, eviction: dict | None, ir: Path = folder, quant: str = "none") -> Row:
        pipe = pipeline(eviction, ir)
        pipe.generate([ids], [warm_up])  # compilation, thread pool, first allocations
        kept_max = P + L if eviction is None else min(P + L, eviction["max_cache_size"] + KV_BLOCK - 1)
        cap = None if eviction is None else eviction["max_cache_size"] + KV_BLOCK / 2

        def run() -> Run:
            t = time.perf_counter()
            results = pipe.generate([ids] * batch, configs)
            seconds = time.perf_counter() - t
            lengths = [len(r.m_generation_ids[0]) for r in results]
            if any(n != L for n in lengths):
                raise RuntimeError(f"openvino {compressor}: generated {sorted(set(lengths))} tokens, asked exactly {L}")
            metrics = pipe.get_metrics()
            return Run(
                seconds,
                sum(lengths),
                int(metrics.kv_cache_size_in_bytes),
                batch * kv_bytes_per_token * kept_max,
                extra={"kv_cache_usage_max_percent": float(metrics.max_cache_usage)},
            )

        fields = {
            "engine": "openvino",
            "compressor": compressor,
            "kv_budget": None if eviction is None else kv_budget,
            "quant": quant,
            "kv_quant": "none",
            "openvino": {
                "version": ov_genai.__version__,
                "precision": precision,
                "threads": threads,
                "ir": str(ir),
                **(
                    {"weights": "int8_sym per channel (NNCF), activations by the CPU plugin"} if quant == "int8" else {}
                ),
                **({"cache_eviction": {**eviction, "aggregation_mode": "SUM"}} if eviction else {}),
            },
        }
        return Row(fields, run, mean_kv_tokens(P, L, cap))

    rows = [row("none", None), row("eviction", eviction_sizes(kv_budget))]
    if "int8" in quants:
        try:
            rows.append(row("none", None, int8_model(folder, log), "int8"))
        except PeerUnavailable as e:
            log(str(e))
    return rows
