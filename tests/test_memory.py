"""sparserl.memory: the peak predicted from the config, the refusal before the model loads, and
``train.gradient_checkpointing: auto``'s answer."""

import json
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from sparserl import runlog as names
from sparserl.config import ConfigError, apply_overrides, load_config
from sparserl.cost import ModelShape
from sparserl.memory import check_fits, gradient_checkpointing_on, memory_limit, predict_peak
from sparserl.memory.activations import autocast_weight_bytes, saved_layer_bytes
from sparserl.memory.predict import BASELINE_BYTES
from sparserl.models.loading import tiny_config

#: the tiny model, dtypes named (``auto`` is timed once per machine, minutes on a fresh cache)
TINY = [
    "model.name=tiny",
    "data.eval=null",
    "mismatch.alpha=exact",
    "rollout.dtype=float32",
    "model.mixed_precision=off",
]
SHAPE = ModelShape.from_config(tiny_config())


def cfg_of(*overrides):
    return load_config("default", [*TINY, *overrides])


def peak(*overrides, prompt=100):
    return predict_peak(cfg_of(*overrides), SHAPE, prompt).peak


@pytest.mark.parametrize("autocast", [False, True])
def test_saved_bytes_per_token_are_what_autograd_saves(autocast):
    """The per-token, per-layer sum of :func:`saved_layer_bytes` (and autocast's weight copies) equals the
    bytes a saved-tensor hook counts in one more decoder layer, the parameters apart."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    B, T = 2, 24

    def count(layers):
        cfg = LlamaConfig(
            vocab_size=64, hidden_size=32, intermediate_size=80, num_hidden_layers=layers,
            num_attention_heads=4, num_key_value_heads=2, head_dim=8, tie_word_embeddings=True,
        )  # fmt: skip
        torch.manual_seed(0)
        m = AutoModelForCausalLM.from_config(cfg)
        params = {p.untyped_storage().data_ptr() for p in m.parameters()}
        seen = {}

        def pack(t):
            ptr = t.untyped_storage().data_ptr()
            if ptr not in params:
                seen[ptr] = t.untyped_storage().nbytes()
            return t

        mask = torch.ones(B, T, dtype=torch.long)
        mask[0, :3] = 0
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                m.model(input_ids=torch.randint(0, 64, (B, T)), attention_mask=mask)
        return sum(seen.values()), cfg

    one, cfg = count(1)
    two, _ = count(2)
    shape = ModelShape.from_config(cfg)
    predicted = saved_layer_bytes(shape, 4, 2 if autocast else 4, T, autocast)
    if autocast:  # the layer's bfloat16 weight copies, which the prediction counts once for the model
        predicted += autocast_weight_bytes(shape) / shape.layers / (B * T)
    assert (two - one) / (B * T) == pytest.approx(predicted, rel=1e-12)


def test_prediction_grows_with_length_and_shrinks_with_checkpointing_and_budget():
    """(The old policy scored apart: an update's forward standing in for it holds α's buffers beside its
    graph, which a longer response that no longer fits one micro-batch gives up.)"""
    off = (
        "train.gradient_checkpointing=false algorithm.old_logprobs=score train.max_tokens_per_micro_batch=null".split()
    )
    assert peak(*off, "rollout.max_new_tokens=512") > peak(*off, "rollout.max_new_tokens=128")
    on = ["train.gradient_checkpointing=true", *off[1:]]
    assert peak(*on, "rollout.max_new_tokens=512") < peak(*off, "rollout.max_new_tokens=512")
    big = [*off[:2], "rollout.max_new_tokens=512", "train.micro_batch_size=32"]
    assert peak(*big, "train.max_tokens_per_micro_batch=2048") < peak(*big, "train.max_tokens_per_micro_batch=16384")
    # the parts are named, and the peak is the resident parts plus the largest station
    p = predict_peak(cfg_of(*big), SHAPE, 100)
    assert p.peak == sum(p.resident.values()) + max(sum(s.values()) for s in p.stations.values())
    assert {"baseline", "learner weights", "gradients", "AdamW moments", "sampler weights"} <= set(p.resident)
    assert "activations" in p.stations["update"]


def test_lora_and_reference_change_the_resident_parts():
    full = predict_peak(cfg_of(), SHAPE, 100)
    lora = predict_peak(cfg_of("train.lora_rank=4"), SHAPE, 100)
    assert lora.resident["AdamW moments"] < full.resident["AdamW moments"] / 10
    ref = predict_peak(cfg_of("algorithm.kl_coef=0.001"), SHAPE, 100)
    assert ref.resident["reference"] == full.resident["learner weights"]


def test_a_local_cluster_counts_its_workers_and_the_pushes_its_object_store_keeps():
    """cluster.rollout_workers on a local Ray: each worker's process (the model it loads, a push being loaded, its
    sampler and its shard's caches) and max(2, k + 1) pushes in the object store join the resident parts; a
    cluster of its own (cluster.address) adds none; partial rollouts keep k caches per worker."""
    alone = predict_peak(cfg_of(), SHAPE, 100)
    # a push is the state dict: the tied head a tensor of its own (SmolLM2-135M: 651 MB an object in Ray's store)
    assert SHAPE.tied_embeddings
    weights = alone.resident["learner weights"] + SHAPE.vocab * SHAPE.hidden * 4
    one = predict_peak(cfg_of("cluster.rollout_workers=1"), SHAPE, 100)
    two = predict_peak(cfg_of("cluster.rollout_workers=2"), SHAPE, 100)
    assert one.resident["object store: 2 weight pushes"] == 2 * weights
    worker = one.resident["rollout workers (1)"]
    assert worker > BASELINE_BYTES + 2 * weights
    assert worker < two.resident["rollout workers (2)"] < 2 * worker  # the shard halves, the rest doubles
    assert one.peak - alone.peak == worker + 2 * weights
    remote = predict_peak(cfg_of("cluster.rollout_workers=1", "cluster.address=auto"), SHAPE, 100)
    assert remote.resident == alone.resident
    ahead = ("cluster.rollout_workers=1", "rollout.async=true", "rollout.max_staleness=3")
    k3 = predict_peak(cfg_of(*ahead), SHAPE, 100)
    assert k3.resident["object store: 4 weight pushes"] == 4 * weights
    # under rollout.async the worker reads each finished rollout on a dense cache: a micro-batch's logits and
    # their log-softmax, float32 [rows, T, V] each, rows bounded by train.max_tokens_per_micro_batch
    cfg = cfg_of("cluster.rollout_workers=1", "rollout.async=true")
    one_ahead = predict_peak(cfg, SHAPE, 100)
    T = cfg.rollout.max_new_tokens
    rows = min(cfg.train.micro_batch_size, cfg.train.max_tokens_per_micro_batch // (100 + T))
    grew = one_ahead.resident["rollout workers (1)"] - worker
    assert 2 * rows * T * SHAPE.vocab * 4 <= grew < 2 * rows * T * SHAPE.vocab * 4 + 2**21  # + its hidden states
    partial = predict_peak(cfg_of(*ahead, "rollout.partial=true"), SHAPE, 100)
    assert partial.resident["rollout workers (1)"] > k3.resident["rollout workers (1)"]  # 3 caches kept, not 1


def test_a_local_cluster_that_does_not_fit_is_told_fewer_steps_ahead_or_fewer_workers():
    from sparserl.memory.fit import suggestions

    base = ("rollout.async=true", "rollout.partial=true")
    big = cfg_of("cluster.rollout_workers=3", "rollout.max_staleness=4", *base)
    limit = predict_peak(cfg_of("cluster.rollout_workers=3", "rollout.max_staleness=2", *base), SHAPE, 100).peak
    assert predict_peak(big, SHAPE, 100).peak > limit
    fixes = [fix for fix, _ in suggestions(big, SHAPE, 100, limit)]
    assert "rollout.max_staleness=2" in fixes
    assert any(fix.startswith("cluster.rollout_workers=") for fix in fixes)


#: 32 responses of 1,024 tokens in one micro-batch, every row whole: on the 2-layer tiny shape checkpointing
#: keeps one layer's saved tensors instead of two (with train.shared_prompt the checkpointed forward would
#: run the rows whole while the plain one forwards each prompt once, and the two predictions nearly meet)
LONG = [
    "rollout.max_new_tokens=1024",
    "train.micro_batch_size=32",
    "train.max_tokens_per_micro_batch=null",
    "train.shared_prompt=false",
]


def tiny_prompt_bound():
    """The prompt bound preflight assumes for the tiny config's training set."""
    from sparserl.preflight import check_data, prompt_tokens_bound

    return prompt_tokens_bound(check_data(cfg_of()))


def test_a_run_that_does_not_fit_is_refused_before_the_model_loads(monkeypatch):
    """build_trainer refuses in preflight, loading nothing; the message names the limit's key and value and
    the keys that fit (checkpointing, the token budget, the response length among them); every suggested
    change fits and passes the check."""
    import sparserl.train.build as build

    def no_model(*a, **k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(build, "build_learner", no_model)
    P = tiny_prompt_bound()
    off = peak(*LONG, "train.gradient_checkpointing=false", prompt=P)
    on = peak(*LONG, "train.gradient_checkpointing=true", prompt=P)
    assert on < 0.9 * off
    limit = (on + off) / 2 / 1e9
    cfg = cfg_of(*LONG, "train.gradient_checkpointing=false", f"train.max_memory_gb={limit:.3f}")
    with pytest.raises(ConfigError) as e:
        build.build_trainer(cfg)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"train.max_memory_gb={cfg.train.max_memory_gb}: ")
    assert f"prompts of at most {P} tokens" in msg
    fixes = re.findall(r"((?:[\w.]+=\S+ ?)+) \([\d.]+ GB\)", msg.split("fits with", 1)[1])
    keys = {f.split("=")[0] for fix in fixes for f in fix.split()}
    assert {"train.gradient_checkpointing", "train.max_tokens_per_micro_batch", "rollout.max_new_tokens"} <= keys
    for fix in fixes:
        fixed = apply_overrides(cfg.model_copy(deep=True), fix.split())
        assert predict_peak(fixed, SHAPE, P).peak <= limit * 1e9, fix
        check_fits(fixed, SHAPE, P)  # no error


def test_far_too_small_a_limit_names_no_fix():
    with pytest.raises(ConfigError, match=r"train.max_memory_gb=0.01: .* not even with"):
        check_fits(cfg_of("train.max_memory_gb=0.01"), SHAPE, 100)


def test_limit_is_the_key_or_the_available_memory():
    assert memory_limit(cfg_of("train.max_memory_gb=3"))[0] == 3e9
    limit, source = memory_limit(cfg_of())
    assert 0 < limit < float("inf") and "available memory" in source


def test_gradient_checkpointing_auto_turns_on_only_when_needed():
    """On when the prediction without it exceeds the limit and with it does not; off when both fit and when
    neither does. The prompt bound is the caller's (the predictions differ with it)."""
    learner = SimpleNamespace(config=tiny_config())  # all it reads of the learner
    P = 256
    off = peak(*LONG, "train.gradient_checkpointing=false", prompt=P)
    on = peak(*LONG, "train.gradient_checkpointing=true", prompt=P)
    assert on < 0.9 * off
    between = f"train.max_memory_gb={(on + off) / 2 / 1e9:.3f}"
    assert gradient_checkpointing_on(cfg_of(*LONG, between), learner, P) is True
    assert gradient_checkpointing_on(cfg_of(*LONG, f"train.max_memory_gb={off * 2 / 1e9:.3f}"), learner, P) is False
    assert gradient_checkpointing_on(cfg_of(*LONG, f"train.max_memory_gb={on / 2 / 1e9:.3f}"), learner, P) is False


def test_config_prints_the_prediction(capsys):
    from sparserl.cli import main

    assert main(["config", *TINY]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("# memory: predicted peak")]
    assert len(lines) == 1 and "limit" in lines[0]


#: the child's peak is its own address space's high-water mark (VmHWM): ``ru_maxrss`` also counts the
#: parent's resident set, which the forked child held until its exec (this pytest process's, ~1.2 GB)
CHILD = """
import dataclasses, json, sys
from sparserl.config import load_config
from sparserl.train import sampler_sync, step
from sparserl.train.build import build_trainer
plain = sampler_sync.sampling_params
full = lambda *a, **k: dataclasses.replace(plain(*a, **k), ignore_eos=True)
sampler_sync.sampling_params = step.sampling_params = full
trainer = build_trainer(load_config("default", sys.argv[1:]))
metrics = step.train_step(trainer, 0)
peak = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM:"))
prompt = max(len(trainer.engine.encode(ex.prompt)) for ex in trainer.data.examples[:200])
logged = {k: metrics[k] for k in ("memory/rss_peak_bytes", "memory/predicted_peak_bytes")}
print(json.dumps({"peak": peak, "prompt": prompt, "dtype": str(trainer.engine.dtype)[6:], "logged": logged}))
"""


def test_tiny_prediction_is_within_a_quarter_of_a_measured_step(tiny):
    """One step of the tiny model in a process of its own, every response at full length: its peak RSS
    within 25% of the prediction (with the sampler's dtype as the run chose it, the prompt measured). The
    ``tiny`` fixture has made the session's cache of the embedded model (the tiny model's tokenizer): a
    child that converted it itself would peak at ~1.2 GB in that one-time conversion, not in the step."""
    assert tiny.name == "tiny"
    overrides = [*TINY, "rollout.max_new_tokens=32", "train.prompts_per_step=2"]
    out = subprocess.run([sys.executable, "-c", CHILD, *overrides], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    run = json.loads(out.stdout.strip().splitlines()[-1])
    cfg = load_config("default", [*overrides, f"rollout.dtype={run['dtype']}"])
    predicted = predict_peak(cfg, SHAPE, run["prompt"]).peak
    assert abs(predicted / run["peak"] - 1) <= 0.25, (predicted, run)
    # the step logs the same two: the process's peak at the step's end, and preflight's prediction for the run
    logged = run["logged"]
    assert 0.9 * run["peak"] <= logged[names.MEMORY_RSS_PEAK] <= run["peak"], run
    assert abs(logged[names.MEMORY_PREDICTED_PEAK] / logged[names.MEMORY_RSS_PEAK] - 1) <= 0.25, run


@pytest.mark.parametrize(
    "job, overrides, prompt, measured_gb",
    [
        # the dense long job: its step-2 peak with glibc's defaults and heap trims, 9.61 GB, less the same step's
        # with glibc's thresholds at 1 MiB (no freed block resident), 8.41 GB (docs/results/memory_over_a_run/)
        (
            "long",
            ["rollout.compressor=none", "rollout.kv_controller=null", "train.max_tokens_per_micro_batch=4096"],
            90,
            9.61 - 8.41,
        ),  # fmt: skip
        # the checkpointed main job: 4,852 MiB against 3,614 MiB the same way (docs/results/main_job_memory/)
        # (measured at the 4,096-token budget of the time; `auto` now gives this job 2,048)
        (
            "default",
            ["train.gradient_checkpointing=true", "train.max_tokens_per_micro_batch=4096"],
            80,
            (4852 - 3614) * 2**20 / 1e9,
        ),
    ],
)
def test_the_allocators_slack_is_the_measured_holes_on_smollm2(job, overrides, prompt, measured_gb):
    """The update station's allocator slack at SmolLM2-135M's shape is what glibc was measured to keep resident
    inside a micro-batch (no more than a fifth above it, never below)."""
    from sparserl.cost.shapes import model_shape

    prediction = predict_peak(load_config(job, overrides), model_shape("smollm2-135m"), prompt)
    slack = prediction.stations["update"]["allocator slack"] / 1e9
    assert measured_gb <= slack <= 1.2 * measured_gb, (slack, measured_gb)
