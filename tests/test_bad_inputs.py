"""Bad inputs over every command end in one clear ``error:`` line, never a traceback (issue 12).

``MATRIX`` is one parametrized table: each case runs the CLI's ``main(argv)`` in-process inside a
workspace of prepared bad files and asserts a non-zero exit, an ``error:`` message naming the culprit,
and no traceback. Nearly every case fails before a model loads, so the whole table takes seconds. New
options join the table as they are added.

Below the table: ``--debug`` shows the traceback, an unexpected exception is not swallowed, strict
resume (refused config changes, ``--allow-config-change``, the run keeps every config, the newest run,
fallback over a corrupt checkpoint), and no unpickling anywhere in ``src/``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from sparserl import cli
from sparserl.config import load_config, save_config

SRC = Path(__file__).resolve().parents[1] / "src" / "sparserl"

#: the tiny-run settings shared with test_train (fast, no math-verify workers)
TINY = [
    "model.name=tiny",
    "train.prompts_per_step=2",
    "rollout.n=2",
    "rollout.max_new_tokens=8",
    "rollout.kv_budget=8",
    "rollout.step_length=4",
    "rollout.window=2",
    "train.micro_batch_size=4",
    "log.tensorboard=false",
    "log.progress=plain",
    "checkpoint.every=1",
    "checkpoint.keep_last=0",
    "train.lr=1e-3",
    "reward.fn=test_bad_inputs:zero_reward",
    "data.eval=null",
    "data.system_prompt=null",
    "rollout.compress_prompt=false",
]


def zero_reward(response: str, label: str) -> float:
    return 0.0


def _write(path: Path, content: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
    return path


def make_workspace(root: Path) -> Path:
    """Every bad (and good) input the matrix refers to, by relative path."""
    rows = [{"problem": "1+1", "answer": "2"}, {"problem": "2+2", "answer": "4"}]
    good = "".join(json.dumps(r) + "\n" for r in rows)
    _write(root / "good.jsonl", good)
    _write(root / "bin.jsonl", b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe binary")
    _write(root / "bin.json", b"\x00\xff\xfe\x00")
    _write(root / "empty.jsonl", "")
    _write(root / "blank.jsonl", "\n\n  \n")
    _write(root / "broken.jsonl", '{"problem": "1+1", "answer": "2"}\n{"problem": "2+2"\n')
    _write(root / "nocol.jsonl", '{"text": "1+1", "y": "2"}\n')
    _write(root / "nolabel.jsonl", '{"problem": "1+1", "answer": "2"}\n{"problem": "3+3"}\n')
    _write(root / "notobj.jsonl", "[1, 2]\n")
    _write(root / "data.txt", "1+1=2\n")
    (root / "nodata").mkdir()
    _write(root / "prompts.jsonl", '{"prompt": "hello"}\n')
    _write(root / "prompts_nokey.jsonl", '{"text": "hello"}\n')
    _write(root / "prompts_broken.jsonl", '{"prompt": "a"}\n{"prompt": \n')
    _write(root / "prompts_bad.jsonl", '{"prompt": 7}\n')
    _write(root / "x.gguf", b"this is not a model" * 10)
    (root / "nomodel").mkdir()
    _write(root / "gpt2/config.json", '{"model_type": "gpt2"}')
    _write(root / "badcfg/config.json", "{not json")
    _write(root / "afile", "a regular file\n")
    _write(root / "sched_broken.json", "[[0, 16],\n [64 32]]")
    _write(root / "sched_calib.json", json.dumps({"schedules": [{"compressor": "snapkv", "budget_by_bin": [[0, 16]]}]}))
    (root / "notrun").mkdir()
    _write(root / "bad.yaml", "train: [unclosed\n")
    _write(root / "list.yaml", "- 1\n- 2\n")
    _write(root / "typo.yaml", "train:\n  stpes: 3\n")
    _write(root / "binary.yaml", b"train:\n  steps: \xff\xfe\n")
    # a run folder: its config (lr 1e-3, seed 0) and one metrics line; no weights needed to refuse a resume
    cfg = load_config("sparse_rl_fixed40", [*TINY, "train.steps=2", f"log.out_dir={root / 'runs'}"])
    save_config(cfg, root / "runs/r1/config.yaml")
    _write(root / "runs/r1/metrics.jsonl", '{"step": 1, "reward/mean": 0.0}\n')
    # a run whose checkpoint is at step 5 (a manifest is all latest_checkpoint looks at)
    save_config(cfg, root / "ahead/config.yaml")
    _write(root / "ahead/checkpoints/step-000005/COMPLETE", "{}")
    # a run whose only checkpoint is corrupt: no fallback, a clear error naming the file
    save_config(cfg, root / "corrupt/config.yaml")
    _write(root / "corrupt/metrics.jsonl", '{"step": 1, "reward/mean": 0.0}\n')
    _write(root / "corrupt/checkpoints/step-000001/COMPLETE", "{truncated")
    return root


T = ["train", *TINY, "train.steps=1"]  # a train command line that would run if nothing were wrong
#: T with the sampler's own log-probs as the old policy, on a dense float32 sampler (where that is allowed)
T_SAMPLER_OLD = [
    *T,
    "rollout.compressor=none",
    "rollout.kv_controller=null",
    "rollout.dtype=float32",
    "algorithm.old_logprobs=sampler",
]
R = ["rollout", "--model", "tiny", "--prompts", "prompts.jsonl", "--out", "out/r.jsonl"]
E = ["eval", "--model", "tiny", "--data", "good.jsonl", "--out", "out/e.json"]
C = ["calibrate", "--model", "tiny", "--data", "good.jsonl", "--json", "c.json"]
B = ["bench", "rollout", "--model", "tiny", "--no-hf", "--max-new-tokens", "4", "--batch", "2"]
RESUME = ["train", "--resume", "--run-dir", "runs/r1"]


def case(cls: str, argv: list[str], culprit: str, id: str):
    return pytest.param(argv, culprit, id=f"{argv[0]}-{cls}-{id}")


MATRIX = [
    # --- train: config -------------------------------------------------------------------------
    case("config", ["train", "no_such_preset"], "no_such_preset", "unknown-preset"),
    case("config", ["train", "rollout.kv_bugdet=3"], "rollout.kv_bugdet", "unknown-key"),
    case("config", ["train", "nosection.key=1"], "nosection", "unknown-section"),
    case("config", ["train", "train.steps=0"], "train.steps", "steps-zero"),
    case("config", ["train", "train.lr=-1"], "train.lr", "lr-negative"),
    case("config", ["train", "train.lr=fast"], "train.lr", "lr-not-a-number"),
    case("config", ["train", "rollout.kv_budget=4", "rollout.window=8"], "rollout.kv_budget", "budget-below-window"),
    case("config", ["train", "rollout.n=1"], "rollout.n", "grpo-n1"),
    case("config", ["train", "rollout.top_p=0"], "rollout.top_p", "top-p-zero"),
    case("config", ["train", "rollout.temperature=-1"], "rollout.temperature", "temperature-negative"),
    case("config", ["train", "rollout.compressor=nope"], "rollout.compressor", "unknown-compressor"),
    case("config", ["train", "mismatch.alpha=exakt"], "mismatch.alpha", "unknown-alpha-mode"),
    case("config", ["train", "mismatch.alpha_bin=0"], "mismatch.alpha_bin", "alpha-bin-zero"),
    case("config", ["train", "mismatch.alpha_record_mib=-1"], "mismatch.alpha_record_mib", "alpha-record-negative"),
    case("config", ["train", "mismatch.alpha_record_mib=lots"], "mismatch.alpha_record_mib", "alpha-record-not-int"),
    case(
        "config",
        ["train", "algorithm.old_logprobs=update", "train.micro_batch_size=16"],
        "algorithm.old_logprobs=update",
        "old-logprobs-update-two-micro-batches",
    ),
    case("config", ["train", "algorithm.old_logprobs=forward"], "algorithm.old_logprobs", "unknown-old-logprobs"),
    case(
        "config",
        ["train", "rollout.kv_schedule=[[64, 16], [32, 24]]"],
        "rollout.kv_schedule",
        "schedule-not-increasing",
    ),
    case("config", ["train", "rollout.kv_schedule=[[0, 0]]"], "budget 0", "schedule-budget-zero"),
    case("config", ["train", "rollout.kv_schedule=missing_sched.json"], "missing_sched.json", "schedule-missing-file"),
    case("config", ["train", "rollout.kv_schedule=sched_broken.json"], "sched_broken.json:2", "schedule-bad-json"),
    case(
        "config",
        ["train", "rollout.kv_schedule=sched_calib.json"],
        "no schedule for compressor 'rkv'",
        "schedule-other-compressor",
    ),
    case(
        "config",
        ["train", "rollout.kv_controller={threshold: 0}"],
        "rollout.kv_controller.threshold",
        "controller-threshold-zero",
    ),
    case(
        "config",
        ["train", "rollout.kv_controller={treshold: 0.9}"],
        "rollout.kv_controller.treshold",
        "controller-unknown-key",
    ),
    case(
        "config",
        ["train", "default", "rollout.kv_controller.treshold=0.7"],
        "did you mean 'rollout.kv_controller.threshold'",
        "controller-dotted-unknown-key",
    ),
    case(
        "config",
        ["train", "default", "rollout.kv_controller.threshold.x=1"],
        "'rollout.kv_controller.threshold' is not a mapping",
        "controller-dotted-too-deep",
    ),
    case(
        "config",
        ["train", "rollout.kv_controller={min_budget: 80, max_budget: 40}"],
        "min_budget=80",
        "controller-min-above-max",
    ),
    case(
        "config",
        ["train", "rollout.kv_controller={}", "mismatch.alpha=off"],
        "mismatch.alpha",
        "controller-without-alpha",
    ),
    case("config", ["train", "cluster.rollout_workers=0"], "cluster.rollout_workers=0", "cluster-workers-zero"),
    case("config", ["train", "cluster.address=auto"], "needs cluster.rollout_workers", "cluster-address-alone"),
    case(
        "config",
        ["train", "cluster.rollout_workers=2", "cluster.address=127.0.0.1:1"],
        "127.0.0.1:1",
        "cluster-address-unreachable",
    ),
    case(
        "config",
        ["train", "cluster.rollout_workers=2", "cluster.address=nowhere"],
        "expected auto or host:port",
        "cluster-address-malformed",
    ),
    case(
        "config", ["train", "cluster.rolout_workers=2"], "did you mean 'cluster.rollout_workers'", "cluster-unknown-key"
    ),
    case(
        "config",
        ["train", "rollout.async=true"],
        "rollout.async=true needs cluster.rollout_workers",
        "async-without-workers",
    ),
    case(
        "config",
        [
            "train",
            "cluster.rollout_workers=1",
            "rollout.async=true",
            "mismatch.alpha_q=kept",
            "mismatch.alpha_record_mib=0",
        ],
        "mismatch.alpha_record_mib=0",
        "async-exact-alpha-replay",
    ),
    case("config", ["train", "rollout.async=maybe"], "rollout.async", "async-not-a-bool"),
    case("config", ["train", "train.lora_rank=-2"], "train.lora_rank=-2", "lora-rank-negative"),
    case("config", ["train", "train.deterministic=sometimes"], "train.deterministic", "deterministic-not-bool"),
    case("config", ["train", "train.lora_target=[]"], "train.lora_target", "lora-target-empty"),
    case(
        "config",
        ["train", "train.lora_rank=4", "train.lora_target=[qkv_proj]"],
        "qkv_proj names no linear module",
        "lora-target-unknown-module",
    ),
    case(
        "config",
        ["train", "rollout.compressor=none", "algorithm.distill_sparse={rank: 4}"],
        "algorithm.distill_sparse needs a sparse sampler",
        "distill-dense-sampler",
    ),
    case(
        "config",
        ["train", "algorithm.distill_sparse={lr: 0.001}"],
        "algorithm.distill_sparse.rank is required",
        "distill-no-rank",
    ),
    case(
        "config",
        ["train", "algorithm.distill_sparse={rank: 4, lambda: -1}"],
        "algorithm.distill_sparse.lambda=-1",
        "distill-lambda-negative",
    ),
    # truncated sampling (top-k / top-p) where what reads q needs the whole distribution: one error each
    case(
        "config",
        [*T, "algorithm.distill_sparse={rank: 4}", "rollout.top_k=20"],
        "φ's loss uses the sampler's full tempered distribution",
        "distill-under-top-k",
    ),
    case(
        "config",
        [*T, "algorithm.distill_sparse={rank: 4}", "rollout.top_p=0.9"],
        "top_p=1 and top_k=0",
        "distill-under-top-p",
    ),
    case(
        "config",
        [*T_SAMPLER_OLD, "rollout.top_k=20"],
        "rollout.top_k=20 truncates the sampled distribution",
        "sampler-old-policy-under-top-k",
    ),
    case(
        "config",
        [*T_SAMPLER_OLD, "rollout.top_p=0.9"],
        "rollout.top_p=0.9 truncates the sampled distribution",
        "sampler-old-policy-under-top-p",
    ),
    case(
        "config",
        ["train", "algorithm.distill_sparse={rank: 4}", "mismatch.alpha=topk"],
        "set mismatch.alpha=exact",
        "distill-without-exact-alpha",
    ),
    case(
        "config",
        ["train", "algorithm.distill_sparse={rank: 4}", "rollout.quant=int8"],
        "not the rounding",
        "distill-quantized-sampler",
    ),
    case(
        "config",
        ["train", "algorithm.distill_sparse={rank: 4}", "rollout.dtype=bfloat16"],
        "algorithm.distill_sparse with rollout.dtype=bfloat16",
        "distill-half-precision-sampler",
    ),
    case(
        "config",
        ["train", "algorithm.distill_sparse={rank: 4, target: [qkv_proj]}"],
        "algorithm.distill_sparse.target=['qkv_proj']: qkv_proj names no linear module",
        "distill-target-unknown",
    ),
    case("config", ["train", "rollout.compressor_options.lamda=0.1"], "lamda", "unknown-compressor-option"),
    case("config", ["train", "algorithm.correction=nope"], "algorithm.correction", "unknown-correction"),
    case(
        "config",
        ["train", "algorithm.correction_options.normalize_over=bogus"],
        "normalize_over",
        "correction-option-value",
    ),
    case("config", ["train", "algorithm.correction_options.is_mode=bogus"], "is_mode", "correction-is-mode"),
    case(
        "config",
        [
            "train",
            "algorithm.correction=icepop",
            "algorithm.correction_options.low=3",
            "algorithm.correction_options.high=2",
        ],
        "low <= high",
        "icepop-band-inverted",
    ),
    case(
        "config",
        ["train", "algorithm.correction=trl_is", "algorithm.correction_options.mode=seq"],
        "mode",
        "trl-is-mode",
    ),
    case("config", ["train", "algorithm.kl_unbiased=true"], "algorithm.kl_coef", "kl-unbiased-without-kl"),
    case("config", ["train", "rollout.oversample=4"], "must be more than rollout.n", "oversample-not-above-n"),
    case("config", ["train", "rollout.oversample_by=reward"], "without rollout.oversample", "oversample-by-alone"),
    case(
        "config", ["train", "rollout.dense_fallback=true", "rollout.compressor=none"], "dense already", "fallback-dense"
    ),
    case(
        "config",
        ["train", "algorithm.correction=double_min", "algorithm.correction_options.upclip=0.5"],
        "upclip must be >= 1",
        "double-min-upclip-below-one",
    ),
    case(
        "config",
        ["train", "algorithm.off_policy_mask_threshold=-1"],
        "off_policy_mask_threshold",
        "off-policy-delta-negative",
    ),
    case(
        "config", ["train", "rollout.fp32_head=true", "rollout.dtype=float32"], "float32 already", "fp32-head-on-fp32"
    ),
    case("config", ["train", "rollout.quant=int9"], "rollout.quant", "unknown-quant"),
    case("config", ["train", "rollout.kv_quant=int4"], "rollout.kv_quant", "unknown-kv-quant"),
    case("config", ["train", "rollout.quant_scale=0"], "rollout.quant_scale", "quant-scale-zero"),
    case(
        "config",
        ["train", "train.lr=1e300"],
        "train.lr=1e+300: must lie within float32's finite range",
        "lr-beyond-float32",
    ),
    case("config", ["train", "algorithm.kl_coef=1e39"], "algorithm.kl_coef=1e+39", "kl-coef-beyond-float32"),
    case(
        "config",
        ["train", "rollout.compressor_options.lam=1e300"],
        "rollout.compressor_options",
        "compressor-option-beyond-float32",
    ),
    case("config", ["train", "train.lr=3e38"], "AdamW's first step size", "lr-step-overflows-float32"),
    case("config", ["train", "reward.timeout_s=1e10"], "reward.timeout_s", "reward-timeout-beyond-a-day"),
    case("config", ["train", "rollout.quant_smooth=1.5"], "rollout.quant_smooth", "quant-smooth-range"),
    case("config", ["train", "rollout.quant_smooth=0.5"], "rollout.quant_smooth", "quant-smooth-no-int8"),
    case("config", ["train", "rollout.quant_outliers=-1"], "rollout.quant_outliers", "quant-outliers-negative"),
    case("config", ["train", "rollout.tail_slack=-4"], "rollout.tail_slack", "tail-slack-config-negative"),
    case("config", ["train", "rollout.quant_outliers=8"], "rollout.quant_outliers", "quant-outliers-no-int8"),
    case("config", ["train", "rollout.quant_head=true"], "rollout.quant_head", "quant-head-no-quant"),
    case(
        "config",
        ["train", "rollout.quant=int8_group", "rollout.quant_group=6"],
        "rollout.quant_group",
        "quant-group-not-multiple-of-4",
    ),
    case(
        "config",
        ["train", "rollout.quant=int8", "rollout.quant_group=32"],
        "rollout.quant_group",
        "quant-group-without-int8-group",
    ),
    case(
        "config",
        ["train", "rollout.quant=int8_group", "rollout.quant_group=0"],
        "rollout.quant_group",
        "quant-group-zero",
    ),
    case("config", ["train", "rollout.mismatch_split=true"], "rollout.mismatch_split", "mismatch-split-no-quant"),
    case("config", ["train", "model.device=tpu"], "model.device", "bad-device"),
    case("config", ["train", "model.dtype=float64"], "model.dtype", "bad-dtype"),
    case("config", ["train", "log.run_name=a/b"], "log.run_name", "run-name-path"),
    case("config", ["train", "bad.yaml"], "bad.yaml", "invalid-yaml"),
    case("config", ["train", "list.yaml"], "list.yaml", "yaml-not-a-mapping"),
    case("config", ["train", "typo.yaml"], "train.stpes", "yaml-unknown-key"),
    case("config", ["train", "binary.yaml"], "not UTF-8", "binary-yaml"),
    # --- train: data ---------------------------------------------------------------------------
    case("data", [*T, "data.train=missing.jsonl"], "data.train='missing.jsonl'", "missing-file"),
    case("data", [*T, "data.train=empty.jsonl"], "empty.jsonl", "empty-file"),
    case("data", [*T, "data.train=blank.jsonl"], "blank.jsonl", "blank-lines-only"),
    case("data", [*T, "data.train=bin.jsonl"], "bin.jsonl line 1: not UTF-8 text", "binary-file"),
    case("data", [*T, "data.train=bin.json"], "not UTF-8 text", "binary-json"),
    case("data", [*T, "data.train=broken.jsonl"], "broken.jsonl line 2", "broken-json-line"),
    case("data", [*T, "data.train=nocol.jsonl"], "which column is the prompt", "no-known-column"),
    case("data", [*T, "data.train=good.jsonl", "data.prompt_key=q"], "missing key 'q'", "missing-column"),
    case("data", [*T, "data.train=nolabel.jsonl"], "nolabel.jsonl line 2", "missing-label"),
    case("data", [*T, "data.train=notobj.jsonl"], "notobj.jsonl", "row-not-object"),
    case("data", [*T, "data.train=data.txt"], "unsupported file type", "unsupported-suffix"),
    case("data", [*T, "data.train=nodata"], "no data file", "folder-without-data"),
    case("data", [*T, "data.train=nope_set"], "unknown data set 'nope_set'", "unknown-set"),
    case("data", [*T, "data.train=arith:digits=0"], "digits", "arith-digits-0"),
    case("data", [*T, "data.train=arith:color=red"], "color", "arith-unknown-key"),
    case("data", [*T, "data.train=arith:n=0"], "n=0", "arith-n-0"),
    case("data", [*T, "data.template=no placeholder"], "template", "template-without-placeholder"),
    case("data", [*T, "data.eval=missing_eval.jsonl"], "data.eval='missing_eval.jsonl'", "missing-eval-file"),
    case("data", [*T, "data.eval=nocol.jsonl"], "data.eval='nocol.jsonl'", "eval-columns-unguessable"),
    case(
        "data",
        [*T, "data.eval=good.jsonl", "data.eval_prompt_key=q"],
        "data.eval='good.jsonl'",
        "eval-prompt-key-missing",
    ),
    case(
        "data",
        [*T, "data.eval=good.jsonl", "data.eval_label_key=zz"],
        "data.eval='good.jsonl'",
        "eval-label-key-missing",
    ),
    case("config", [*T, "data.eval_prompt_key=''"], "data.eval_prompt_key", "eval-prompt-key-empty"),
    case("config", [*T, "data.prompt_key=''"], "data.prompt_key", "prompt-key-empty"),
    case("config", [*T, "algorithm.mask_truncated=maybe"], "algorithm.mask_truncated", "mask-truncated-not-bool"),
    case("config", [*T, "algorithm.max_gen_batches=0"], "algorithm.max_gen_batches", "max-gen-batches-zero"),
    case(
        "config",
        [*T, "algorithm.filter_groups=true", "rollout.async=true", "cluster.rollout_workers=1"],
        "invalid config",
        "filter-groups-async",
    ),
    case("config", [*T, "train.lr_scheduler=cosin"], "did you mean 'cosine'", "lr-scheduler-typo"),
    case("config", [*T, "train.min_lr_ratio=2"], "train.min_lr_ratio=2", "min-lr-ratio-above-one"),
    case("config", [*T, "train.max_nonfinite_steps=0"], "train.max_nonfinite_steps", "max-nonfinite-steps-zero"),
    case(
        "config",
        [*T, "train.max_tokens_per_micro_batch=8"],
        "train.max_tokens_per_micro_batch=8",
        "token-budget-below-one-response",
    ),
    case("config", [*T, "train.max_memory_gb=0.01"], "train.max_memory_gb=0.01", "max-memory-far-too-small"),
    case("config", [*T, "train.max_tokens_per_micro_batch=aut"], "did you mean 'auto'", "token-budget-typo"),
    case("config", [*T, "train.trim_heap=sometimes"], "train.trim_heap", "trim-heap-not-bool"),
    case("config", [*T, "rollout.max_staleness=-1"], "rollout.max_staleness=-1", "max-staleness-negative"),
    case("config", [*T, "rollout.max_staleness=2"], "rollout.async=true", "max-staleness-without-async"),
    case("config", [*T, "rollout.partial=true"], "rollout.async=true", "partial-without-async"),
    case("config", [*T, "rollout.partial_max_lag=-1"], "rollout.partial_max_lag=-1", "partial-max-lag-negative"),
    case("config", [*T, "rollout.partial_max_lag=2"], "rollout.partial=true", "partial-max-lag-without-partial"),
    case("config", [*T, "rollout.partial_kv=recompute"], "rollout.partial=true", "partial-kv-without-partial"),
    case("config", [*T, "rollout.join_rollouts=true"], "rollout.partial=true", "join-rollouts-without-partial"),
    case("config", [*T, "rollout.partial_kv=recompuet"], "did you mean 'recompute'", "partial-kv-typo"),
    case(
        "config",
        [
            *T,
            "rollout.partial=true",
            "rollout.async=true",
            "cluster.rollout_workers=1",
            "mismatch.alpha=off",
            "rollout.max_staleness=2",
            "rollout.partial_max_lag=0",
        ],
        "rollout.partial_max_lag=0 masks every token",
        "partial-max-lag-masks-everything",
    ),  # fmt: skip
    case(
        "config",
        [
            *T,
            "rollout.partial=true",
            "rollout.async=true",
            "cluster.rollout_workers=1",
            "mismatch.alpha=off",
            "rollout.max_staleness=2",
            "rollout.partial_max_lag=2",
        ],
        "rollout.partial_max_lag=2 masks no token",
        "partial-max-lag-masks-nothing",
    ),  # fmt: skip
    case("config", [*T, "rollout.static_check_every=0"], "rollout.static_check_every", "static-check-every-zero"),
    case("config", [*T, "rollout.static_check_every=4"], "rollout.static_step", "static-check-every-without-step"),
    # an option that does nothing where it is given is refused, naming the key that would enable it
    case("config", [*T, "train.lora_target=[q_proj]"], "train.lora_rank", "lora-target-without-rank"),
    case(
        "config",
        ["train", "sparse_rl_fixed40", *TINY, "rollout.compressor=none", "rollout.kv_schedule=[[0,8]]"],
        "rollout.compressor",
        "kv-schedule-without-compressor",
    ),
    case("config", [*T, "algorithm.max_gen_batches=8"], "algorithm.filter_groups", "max-gen-batches-unused"),
    case("config", [*T, "train.min_lr_ratio=0.1"], "train.lr_scheduler", "min-lr-ratio-under-constant"),
    case(
        "config",
        [*T, "algorithm.importance_sampling_level=sequense"],
        "did you mean 'sequence'",
        "importance-sampling-level-typo",
    ),
    case(
        "config",
        [*T, "reward.overlong_buffer.penalty_factor=1"],
        "override: reward.overlong_buffer.len is required",
        "overlong-buffer-without-len",
    ),
    case("config", [*T, "reward.overlong_buffer.len=49"], "reward.overlong_buffer.len=49", "overlong-buffer-too-long"),
    case("config", [*T, "reward.overlong_buffer.len=0"], "reward.overlong_buffer.len", "overlong-buffer-zero"),
    case(
        "config",
        [*T, "reward.overlong_buffer.lenght=8"],
        "did you mean 'reward.overlong_buffer.len'",
        "overlong-buffer-typo",
    ),
    # --- train: model and reward ---------------------------------------------------------------
    case("model", ["train", *TINY, "model.name=no_such_dir"], "no_such_dir", "missing-folder"),
    case("model", ["train", *TINY, "model.name=x.gguf"], "not a GGUF file", "corrupt-gguf"),
    case("model", ["train", *TINY, "model.name=missing.gguf"], "missing.gguf", "missing-gguf"),
    case("model", ["train", *TINY, "model.name=nomodel"], "no config.json", "folder-without-config"),
    case("model", ["train", *TINY, "model.name=gpt2"], "'gpt2' is not supported", "unsupported-family"),
    case("model", ["train", *TINY, "model.name=badcfg"], "config.json: invalid JSON", "broken-config-json"),
    case(
        "model",
        [*T, "rollout.quant=int8", "rollout.quant_outliers=64"],
        "rollout.quant_outliers=64",
        "quant-outliers-whole-linear",
    ),
    case("model", ["train", *TINY, "model.name=afile"], "afile", "a-file"),
    case("model", ["train", *TINY, "model.device=cuda:99"], "model.device='cuda:99'", "missing-device"),
    case("reward", ["train", *TINY, "reward.fn=no_such_module:fn"], "no_such_module", "missing-module"),
    case("reward", ["train", *TINY, "reward.fn=nope"], "unknown reward name", "unknown-name"),
    case("reward", ["train", *TINY, "reward.fn=os:sep"], "not callable", "not-callable"),
    case("reward", ["train", *TINY, "reward.fn=json:no_such_fn"], "no_such_fn", "missing-attribute"),
    case(
        "reward",
        ["train", *TINY, "reward.fn=[test_bad_inputs:zero_reward, no_such_module:fn]"],
        "no_such_module",
        "list-part-missing-module",
    ),
    case(
        "reward",
        ["train", *TINY, "reward.fn=[math, test_bad_inputs:zero_reward]", "reward.weights=[1]"],
        "1 weights for the 2 reward",
        "weights-count",
    ),
    case("reward", ["train", *TINY, "reward.weights=[1, x]"], "reward.weights", "weights-not-numbers"),
    # --- train: checkpoints, resume, output paths, flags ---------------------------------------
    case("checkpoint", ["train", "--resume", "--run-dir", "no_such_run"], "no_such_run", "resume-missing-folder"),
    case("checkpoint", ["train", "--resume", "--run-dir", "notrun"], "not a run folder", "resume-not-a-run"),
    case("checkpoint", ["train", "--resume", "log.out_dir=notrun"], "no run folder under", "resume-newest-none"),
    case("checkpoint", [*RESUME, "train.lr=0.01"], "train.lr: 0.001 -> 0.01", "resume-changed-lr"),
    case("checkpoint", [*RESUME, "train.seed=7"], "train.seed: 0 -> 7", "resume-changed-seed"),
    case(
        "checkpoint",
        ["train", "sparse_rl_fixed40", "--resume", "--run-dir", "runs/r1"],
        "reward.fn: 'test_bad_inputs:zero_reward' -> ",
        "resume-other-config",
    ),
    case("checkpoint", ["train", "--resume", "--run-dir", "ahead", "train.steps=3"], "at step 5", "resume-fewer-steps"),
    case("checkpoint", ["train", "--resume", "--run-dir", "corrupt"], "COMPLETE", "resume-corrupt-checkpoint"),
    case("checkpoint", [*T, "--run-dir", "runs/r1"], "already holds a run", "fresh-into-existing-run"),
    case("output", [*T, "--run-dir", "afile/run"], "afile", "run-dir-under-file"),
    case("output", [*T, "--run-dir", "afile"], "afile", "run-dir-is-file"),
    case("output", [*T, "log.out_dir=/proc/sparserl-no"], "cannot write", "out-dir-unwritable"),
    case("output", [*T, "log.out_dir=afile/runs"], "afile", "out-dir-under-file"),
    case("flags", ["train", "--allow-config-change"], "--allow-config-change", "allow-without-resume"),
    case("flags", ["train", "--no-such-flag"], "--no-such-flag", "unknown-flag"),
    # --- rollout --------------------------------------------------------------------------------
    case("numbers", [*R, "--n", "0"], "--n", "n-zero"),
    case("numbers", [*R, "--max-new-tokens", "0"], "--max-new-tokens", "max-new-tokens-zero"),
    case("numbers", [*R, "--temperature", "-1"], "--temperature", "temperature-negative"),
    case("numbers", [*R, "--top-p", "0"], "--top-p", "top-p-zero"),
    case("numbers", [*R, "--top-p", "1.5"], "--top-p", "top-p-above-1"),
    case("numbers", [*R, "--top-k", "-1"], "--top-k", "top-k-negative"),
    case("numbers", [*R, "--kv-budget", "0"], "--kv-budget", "kv-budget-zero"),
    case("numbers", [*R, "--step-length", "0"], "--step-length", "step-length-zero"),
    case("numbers", [*R, "--window", "-1"], "--window", "window-negative"),
    case("numbers", [*R, "--compressor", "rkv", "--tail-slack", "-1"], "--tail-slack", "tail-slack-negative"),
    case(
        "numbers", [*R, "--compressor", "rkv", "--kv-budget", "4", "--window", "8"], "--window 8", "budget-below-window"
    ),
    case(
        "numbers",
        [*R, "--compressor", "rkv", "--kv-budget", "4"],
        "observation window (8)",
        "budget-below-default-window",
    ),
    case("numbers", [*R, "--n", "two"], "--n", "n-not-a-number"),
    case("flags", [*R, "--compressor", "nope"], "nope", "unknown-compressor"),
    case("flags", [*R, "--compressor-options", "{bad"], "--compressor-options", "options-bad-json"),
    case("flags", [*R, "--compressor-options", "[1, 2]"], "--compressor-options", "options-not-object"),
    case("flags", [*R, "--compressor", "rkv", "--compressor-options", '{"lamda": 0.1}'], "lamda", "unknown-option"),
    case("flags", [*R, "--dtype", "float64"], "--dtype", "bad-dtype"),
    case("flags", [*R, "--stop", ""], "--stop", "empty-stop"),
    case("data", [*R[:3], "--prompts", "missing.jsonl", *R[5:]], "missing.jsonl", "prompts-missing"),
    case("data", [*R[:3], "--prompts", "bin.jsonl", *R[5:]], "not UTF-8 text", "prompts-binary"),
    case("data", [*R[:3], "--prompts", "empty.jsonl", *R[5:]], "empty.jsonl", "prompts-empty"),
    case(
        "data", [*R[:3], "--prompts", "prompts_broken.jsonl", *R[5:]], "prompts_broken.jsonl line 2", "prompts-broken"
    ),
    case("data", [*R[:3], "--prompts", "prompts_nokey.jsonl", *R[5:]], "missing key 'prompt'", "prompts-no-key"),
    case("data", [*R[:3], "--prompts", "prompts_bad.jsonl", *R[5:]], "'prompt' must be", "prompts-bad-type"),
    case("model", ["rollout", "--model", "no_such_dir", *R[3:]], "no_such_dir", "missing-model"),
    case("model", ["rollout", "--model", "x.gguf", *R[3:]], "not a GGUF file", "corrupt-gguf"),
    case("output", [*R[:-1], "afile/r.jsonl"], "afile", "out-under-file"),
    case("output", [*R[:-1], "/proc/sparserl-no/r.jsonl"], "cannot write", "out-unwritable"),
    case("output", [*R[:-1], "notrun"], "is a folder", "out-is-folder"),
    case("flags", R[:-2], "--out", "out-missing"),
    case("data", [*R, "--prompt-key", "text"], "prompts.jsonl line 1", "prompt-key-missing"),
    case("flags", [*R, "--prompt-key", ""], "--prompt-key", "prompt-key-empty"),
    # --- eval -----------------------------------------------------------------------------------
    case("numbers", [*E, "--n", "0"], "--n", "n-zero"),
    case("numbers", [*E, "--batch", "0"], "--batch", "batch-zero"),
    case("numbers", [*E, "--limit", "0"], "--limit", "limit-zero"),
    case("numbers", [*E, "--limit", "-3"], "--limit", "limit-negative"),
    case("numbers", [*E, "--max-new-tokens", "0"], "--max-new-tokens", "max-new-tokens-zero"),
    case("numbers", [*E, "--temperature", "-0.5"], "--temperature", "temperature-negative"),
    case("numbers", [*E, "--kv-budget", "0"], "--kv-budget", "kv-budget-zero"),
    case("data", ["eval", "--model", "tiny", "--data", "missing.jsonl"], "--data missing.jsonl", "missing-file"),
    case("data", ["eval", "--model", "tiny", "--data", "bin.jsonl"], "not UTF-8 text", "binary-file"),
    case("data", ["eval", "--model", "tiny", "--data", "arith:digits=0"], "digits", "arith-digits-0"),
    case("data", ["eval", "--model", "tiny", "--data", "broken.jsonl"], "broken.jsonl line 2", "broken-json"),
    case("model", ["eval", "--model", "no_such_dir"], "no_such_dir", "missing-model"),
    case("model", ["eval", "--model", "x.gguf"], "not a GGUF file", "corrupt-gguf"),
    case("output", [*E[:-1], "afile/e.json"], "afile", "out-under-file"),
    case("output", [*E[:-1], "/proc/sparserl-no/e.json"], "cannot write", "out-unwritable"),
    case("flags", [*E, "--compressor", "nope"], "nope", "unknown-compressor"),
    case(
        "flags", [*E, "--compressor", "rkv", "--compressor-options", "{bad"], "--compressor-options", "options-bad-json"
    ),
    case("flags", [*E, "--dtype", "float64"], "--dtype", "bad-dtype"),
    case("data", [*E, "--prompt-key", "q"], "--data good.jsonl", "prompt-key-missing"),
    case("data", [*E, "--label-key", "zz"], "--data good.jsonl", "label-key-missing"),
    case("data", [*E[:4], "nocol.jsonl", *E[5:]], "--data nocol.jsonl", "columns-unguessable"),
    case("flags", [*E, "--template", "no slot"], "--template", "template-without-problem"),
    case("flags", [*E, "--reward", "no_such_module:fn"], "--reward no_such_module:fn", "reward-unknown-module"),
    case("flags", [*E, "--reward", "mathh"], "--reward mathh", "reward-unknown-name"),
    case("numbers", [*E, "--reward-timeout-s", "0"], "--reward-timeout-s", "reward-timeout-zero"),
    # --- bench rollout --------------------------------------------------------------------------
    case("numbers", [*B, "--batch", "0"], "--batch", "batch-zero"),
    case("numbers", [*B, "--max-new-tokens", "0"], "--max-new-tokens", "max-new-tokens-zero"),
    case("numbers", [*B, "--kv-budget", "0"], "--kv-budget", "kv-budget-zero"),
    case("data", [*B, "--kv-schedule", "missing_sched.json"], "--kv-schedule", "kv-schedule-missing"),
    case("data", [*B, "--kv-schedule", "sched_broken.json"], "sched_broken.json:2", "kv-schedule-bad-json"),
    case(
        "data",
        [*B, "--compressors", "rkv", "--kv-schedule", "sched_calib.json"],
        "no schedule for compressor 'rkv'",
        "kv-schedule-other-compressor",
    ),
    case("numbers", [*B, "--step-length", "-1"], "--step-length", "step-length-negative"),
    case("numbers", [*B, "--tail-slack", "-2"], "--tail-slack", "bench-tail-slack-negative"),
    case("flags", [*B, "--compressors", "rkv,nope"], "nope", "unknown-compressor"),
    case("flags", [*B, "--dtype", "float64"], "--dtype", "bad-dtype"),
    case("flags", [*B, "--device", "tpu9"], "--device", "bad-device"),
    case("flags", [*B, "--quant", "int9"], "int9", "unknown-quant"),
    case("flags", [*B, "--kv-quant", "int4"], "int4", "unknown-kv-quant"),
    case("numbers", [*B, "--quant", "int8", "--quant-smooth", "1.5"], "--quant-smooth", "quant-smooth-range"),
    case("numbers", [*B, "--quant", "int8", "--quant-outliers", "-3"], "--quant-outliers", "quant-outliers-negative"),
    case("flags", [*B, "--kernels", "flash"], "--kernels", "unknown-kernels"),
    case("numbers", [*B, "--quant", "int8_group", "--quant-group", "30"], "--quant-group", "quant-group-odd"),
    case("numbers", [*B, "--quant", "int8_group", "--quant-group", "0"], "--quant-group", "quant-group-zero"),
    case("flags", [*B, "--quant", "int8", "--quant-group", "32"], "--quant-group", "quant-group-no-int8-group"),
    case("flags", [*B, "--kernels", ","], "--kernels", "no-kernels"),
    case("flags", [*B, "--attention", "flash"], "--kernels", "unknown-kernels-old-name"),
    case("model", [*B, "--model", "x.gguf"], "not a GGUF file", "corrupt-gguf"),
    case("output", [*B, "--json", "afile/b.json"], "afile", "json-under-file"),
    case("output", [*B, "--json", "/proc/sparserl-no/b.json"], "cannot write", "json-unwritable"),
    case("output", ["bench", "setup-openvino", "--venv", "afile"], "afile", "setup-venv-is-file"),
    # --- bench learner ---------------------------------------------------------------------------
    case("numbers", ["bench", "learner", "model.name=tiny", "--repeat", "0"], "--repeat", "learner-repeat-zero"),
    case(
        "config", ["bench", "learner", "model.mixed_precison=bfloat16"], "model.mixed_precison", "learner-unknown-key"
    ),
    case(
        "config", ["bench", "learner", "model.mixed_precision=fp16"], "model.mixed_precision", "learner-bad-precision"
    ),
    case(
        "config", ["bench", "learner", "model.name=tiny", "model.dtype=bfloat16"], "model.dtype", "learner-bf16-weights"
    ),
    case(
        "output", ["bench", "learner", "model.name=tiny", "--json", "afile/l.json"], "afile", "learner-json-under-file"
    ),
    # --- report, demo, compare ------------------------------------------------------------------
    case("output", ["report", "no_such_run"], "no_such_run", "missing-folder"),
    case("output", ["report", "notrun"], "not a run folder", "not-a-run"),
    case("output", ["report", "afile"], "afile", "a-file"),
    case("model", ["demo", "--model", "no_such_dir"], "no_such_dir", "missing-model"),
    case("model", ["demo", "--model", "x.gguf"], "not a GGUF file", "corrupt-gguf"),
    case("numbers", ["compare", "--seeds", "0", "--out", "cmp"], "seeds", "seeds-zero"),
    case("output", ["compare", "sparse_rl_fixed40", "--out", "afile"], "afile", "out-is-file"),
    case("flags", ["compare", "--arms", "nope", "--out", "cmp"], "nope", "unknown-arm"),
    case(
        "flags",
        ["compare", "--arms", "dense,sparse_rl", "--paired-against", "sparse_r", "--out", "cmp"],
        "did you mean 'sparse_rl'",
        "paired-against-unknown-arm",
    ),
    case(
        "flags",
        ["compare", "--arms", "dense,loose=preset:sparow;rollout.n=4", "--out", "cmp"],
        "no preset named 'sparow'",
        "preset-variant-unknown-preset",
    ),
    # --- config -------------------------------------------------------------------------------
    case("config", ["config", "no_such_preset"], "no_such_preset", "unknown-preset"),
    case("config", ["config", "rollout.kv_bugdet=3"], "rollout.kv_bugdet", "unknown-key"),
    case("config", ["config", "typo.yaml"], "typo.yaml", "typo-in-file"),
    case(
        "config",
        ["config", "rollout.kv_controller={}", "rollout.compressor=none"],
        "invalid config",
        "cross-field-rule",
    ),
    case("flags", ["config", "--keys", "zz_no_such_key"], "--keys", "keys-match-nothing"),
    case("flags", ["config", "default", "--keys"], "--keys", "keys-with-config"),
    # --- calibrate ------------------------------------------------------------------------------
    case("data", [*C, "--label-key", "zz"], "--data good.jsonl", "label-key-missing"),
    case("numbers", [*C, "--threshold", "1.5"], "--threshold", "threshold-above-one"),
    case("numbers", [*C, "--threshold", "0"], "--threshold", "threshold-zero"),
    case("numbers", [*C, "--budgets", ""], "--budgets", "budgets-empty"),
    case("numbers", [*C, "--budgets", "32,-8"], "--budgets", "budgets-negative"),
    case("numbers", [*C, "--bin", "0"], "--bin", "bin-zero"),
    case("numbers", [*C, "--alpha-record-mib", "-5"], "--alpha-record-mib", "alpha-record-mib-negative"),
    case("numbers", [*C, "--alpha-record-mib", "lots"], "--alpha-record-mib", "alpha-record-mib-not-int"),
    case("numbers", [*C, "--max-new-tokens", "8", "--min-new-tokens", "16"], "--min-new-tokens", "min-above-max"),
    case("flags", [*C, "--compressors", "rkvv"], "rkvv", "unknown-compressor"),
    case(
        "data",
        ["calibrate", "--model", "tiny", "--data", "missing.jsonl", "--json", "c.json"],
        "missing.jsonl",
        "data-missing",
    ),
    case("output", [*C, "--json", "afile/c.json"], "afile", "json-under-file"),
]


def run_cli(argv: list[str], capsys) -> tuple[int, str]:
    """``main(argv)`` in-process: (exit code, stdout + stderr). argparse's own errors exit 2 with
    its usage and an ``error:`` line, which counts as a clear message too."""
    try:
        rc = cli.main(argv)
    except SystemExit as e:
        rc = e.code
    out = capsys.readouterr()
    return rc, out.out + out.err


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    monkeypatch.delenv("SPARSERL_DEBUG", raising=False)
    monkeypatch.chdir(make_workspace(tmp_path))
    return tmp_path


@pytest.mark.parametrize("argv, culprit", MATRIX)
def test_bad_input_gives_a_clear_error(argv, culprit, workspace, capsys):
    before = sorted(p.relative_to(workspace) for p in workspace.rglob("*"))
    rc, text = run_cli(argv, capsys)
    assert rc not in (0, None), text
    assert "Traceback" not in text, text
    assert "error:" in text, text
    assert culprit in text, text
    # nothing was made: no run folder, no output file (the checks ran before any work)
    after = sorted(p.relative_to(workspace) for p in workspace.rglob("*"))
    assert after == before


#: (variable, value, command line, culprit): a folder variable that names a file, or a folder that
#: cannot be made, is one error naming the variable and the path, before any model loads
ENV_MATRIX = [
    pytest.param("SPARSERL_CACHE", "afile", ["train"], "SPARSERL_CACHE='afile': it is a file", id="cache-is-a-file"),
    pytest.param(
        "SPARSERL_CACHE",
        "afile/cache",
        ["rollout", "--model", "smollm2-135m", *R[3:]],
        "SPARSERL_CACHE='afile/cache': afile is a file",
        id="cache-under-a-file",
    ),
    pytest.param(
        "SPARSERL_CACHE",
        "/proc/sparserl-no",
        ["demo"],
        "SPARSERL_CACHE='/proc/sparserl-no': cannot create",
        id="cache-cannot-be-made",
    ),
    pytest.param(
        "SPARSERL_DATA_DIR",
        "afile",
        [*T, "data.train=gsm8k"],
        "SPARSERL_DATA_DIR='afile': it is a file",
        id="data-dir-is-a-file",
    ),
    pytest.param(
        "SPARSERL_NATIVE_CACHE",
        "afile",
        [*B, "--compressors", "none"],
        "SPARSERL_NATIVE_CACHE='afile': it is a file",
        id="native-cache-is-a-file",
    ),
]


@pytest.mark.parametrize("var, value, argv, culprit", ENV_MATRIX)
def test_a_bad_folder_variable_gives_a_clear_error(var, value, argv, culprit, workspace, capsys, monkeypatch):
    from sparserl.rollout import native

    if var == "SPARSERL_NATIVE_CACHE" and native._compiler() is None:
        pytest.skip("no C compiler: the native kernels (and their cache) are never built here")
    monkeypatch.setattr("sparserl.models.loading._gguf_to_hf", lambda *a, **k: pytest.fail("the model loaded"))
    monkeypatch.setenv(var, value)
    native.reset()  # the library is found (in its cache folder) again
    try:
        before = sorted(p.relative_to(workspace) for p in workspace.rglob("*"))
        rc, text = run_cli(argv, capsys)
        assert rc == 1 and "Traceback" not in text, text
        assert f"error: {culprit}" in text or f"- {culprit}" in text, text
        assert sorted(p.relative_to(workspace) for p in workspace.rglob("*")) == before
    finally:
        monkeypatch.delenv(var)
        native.reset()


def test_every_float_field_is_checked_against_float32():
    """Each float field of the config (and floats inside options and lists) refuses a value beyond
    float32's range with one line naming the key and the value; the largest float32 passes."""
    import typing

    from sparserl.config import FLOAT32_MAX, SECTIONS, ConfigError

    def has_float(tp) -> bool:
        return tp is float or any(has_float(a) for a in typing.get_args(tp))

    keys = [
        f"{sec}.{name}"
        for sec, cls in SECTIONS.items()
        for name, f in cls.model_fields.items()
        if has_float(f.annotation)
    ]
    assert {
        "train.lr",
        "train.eps",
        "train.betas",
        "algorithm.clip_eps_high",
        "rollout.temperature",
        "eval.temperature",
        "reward.timeout_s",
    } <= set(keys)
    lists = {"train.betas": "[0.9, {}]", "reward.weights": "[{}]"}  # list fields: the value inside a list
    for key in keys:
        form = lists.get(key, "{}")
        with pytest.raises(ConfigError) as e:
            load_config("sparse_rl_fixed40", [f"{key}={form.format('1e39')}"])
        assert f"override: {key}" in str(e.value) and "1e+39" in str(e.value), str(e.value)
        if "must be <" not in str(e.value):  # a field without a smaller upper bound of its own
            assert "float32's finite range" in str(e.value), str(e.value)
            assert load_config(
                "sparse_rl_fixed40", [f"{key}={form.format(repr(FLOAT32_MAX))}"]
            )  # the largest float32 is fine
    for over in (
        "rollout.compressor_options.lam=-1e39",
        "algorithm.correction_options.is_cap=.inf",
        "algorithm.correction=[[tis, {is_cap: 1e300}]]",
    ):
        with pytest.raises(ConfigError, match="float32's finite range"):
            load_config("sparse_rl_fixed40", [over])


def test_matrix_covers_every_command_and_class():
    ids = [p.id for p in MATRIX]
    assert len(ids) == len(set(ids)) >= 60
    commands = {i.split("-")[0] for i in ids}
    assert commands >= {"train", "rollout", "eval", "bench", "report", "demo", "compare", "config"}
    classes = {i.split("-")[1] for i in ids}
    assert classes >= {"config", "data", "model", "reward", "checkpoint", "numbers", "output", "flags"}


# ------------------------------------------------------------------------------------- the boundary


def test_a_native_arch_that_does_not_build_is_a_clear_error(workspace, capsys, monkeypatch):
    """$SPARSERL_NATIVE_ARCH asks for one build of the kernels: when it does not build, the command
    stops before any work with an error naming the variable (falling back to torch would measure
    something else); without the variable a failed build still warns and runs torch."""
    from sparserl.rollout import native

    if native.library() is None:
        pytest.skip("no C compiler: the native kernels never build here")
    from sparserl.bench import rollout as bench_rollout

    monkeypatch.setattr(bench_rollout, "load_model", lambda *a, **k: pytest.fail("the model loaded first"))
    monkeypatch.setenv("SPARSERL_NATIVE_ARCH", "-mno-such-isa-flag")
    native.reset()
    try:
        before = sorted(p.relative_to(workspace) for p in workspace.rglob("*"))
        rc, text = run_cli([*B, "--json", "out/b.json"], capsys)
        assert rc == 1 and "Traceback" not in text, text
        assert "error: SPARSERL_NATIVE_ARCH='-mno-such-isa-flag'" in text and "unset it" in text, text
        assert sorted(p.relative_to(workspace) for p in workspace.rglob("*")) == before
    finally:
        monkeypatch.delenv("SPARSERL_NATIVE_ARCH")
        native.reset()
    assert native.library() is not None  # the -march=native build again


def test_debug_shows_the_traceback(workspace, capsys, monkeypatch):
    rc, text = run_cli(["--debug", "eval", "--n", "0"], capsys)
    assert rc == 1 and "Traceback" in text and "OptionError" in text and "error: --n 0" in text
    rc, text = run_cli(["eval", "--n", "0", "--debug"], capsys)
    assert rc == 1 and "Traceback" in text
    monkeypatch.setenv("SPARSERL_DEBUG", "1")
    rc, text = run_cli(["report", "no_such_run"], capsys)
    assert rc == 1 and "Traceback" in text and "error: report: run folder no_such_run" in text
    monkeypatch.setenv("SPARSERL_DEBUG", "0")
    rc, text = run_cli(["report", "no_such_run"], capsys)
    assert rc == 1 and "Traceback" not in text


def test_an_unexpected_exception_is_not_swallowed(workspace, monkeypatch):
    import sparserl.eval.report as report

    def boom(*a, **k):
        raise RuntimeError("a bug")

    monkeypatch.setattr(report, "make_report", boom)
    with pytest.raises(RuntimeError, match="a bug"):
        cli.main(["report", "runs/r1"])


def test_every_user_error_shares_one_base():
    from sparserl.compare.arms import CompareError
    from sparserl.config import ConfigError
    from sparserl.data import DataError, DataFileNotFoundError
    from sparserl.envpath import EnvPathError
    from sparserl.errors import OptionError, SparserlError
    from sparserl.models.loading import ModelLoadError
    from sparserl.registry import UnknownNameError
    from sparserl.reward.registry import RewardSpecError
    from sparserl.rollout.kv import CompressorOptionError
    from sparserl.train.checkpoint import CheckpointError, CheckpointWriteError
    from sparserl.train.run_folder import ResumeError

    for cls in (
        CompareError,
        ConfigError,
        DataError,
        DataFileNotFoundError,
        OptionError,
        ModelLoadError,
        UnknownNameError,
        RewardSpecError,
        CompressorOptionError,
        CheckpointError,
        CheckpointWriteError,
        ResumeError,
        EnvPathError,
    ):
        assert issubclass(cls, SparserlError), cls
    assert issubclass(DataFileNotFoundError, FileNotFoundError) and issubclass(DataError, ValueError)


def test_no_unpickling_in_src():
    """Checkpoints and data are read as safetensors / JSON / YAML only: no pickle module, no
    torch.load without weights_only=True anywhere in src/."""
    pickle_use = re.compile(
        r"^\s*(import\s+(c?pickle|dill|joblib)\b|from\s+(c?pickle|dill|joblib)\s+import)"
        r"|\b(c?pickle|dill|joblib)\.(loads?|Unpickler)\b",
        re.M,
    )
    offenders = []
    for path in SRC.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        if pickle_use.search(text):
            offenders.append(f"{path}: pickle")
        for m in re.finditer(r"torch\.load\(", text):
            call = text[m.start() : text.find(")", m.start()) + 1]
            if "weights_only=True" not in call:
                offenders.append(f"{path}: {call}")
        if re.search(r"yaml\.load\((?![^)]*Loader=_Loader)", text) or "yaml.unsafe_load" in text:
            offenders.append(f"{path}: unsafe yaml")
    assert not offenders, offenders


# ------------------------------------------------------------------------------------ strict resume


def _train(tmp_path, capsys, *extra, run="run"):
    argv = [
        "train",
        "sparse_rl_fixed40",
        *TINY,
        f"log.out_dir={tmp_path / 'runs'}",
        "--run-dir",
        str(tmp_path / run),
        *extra,
    ]
    return run_cli(argv, capsys)


@pytest.fixture
def one_step_run(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("SPARSERL_DEBUG", raising=False)
    rc, text = _train(tmp_path, capsys, "train.steps=1")
    assert rc == 0, text
    return tmp_path / "run"


def test_resume_refuses_a_changed_config_and_keeps_every_config(tmp_path, capsys, one_step_run):
    run = one_step_run
    first = (run / "config.yaml").read_bytes()
    rc, text = _train(tmp_path, capsys, "train.steps=2", "train.lr=0.01", "train.seed=3", "--resume")
    assert rc == 1 and "Traceback" not in text
    assert "train.lr: 0.001 -> 0.01" in text and "train.seed: 0 -> 3" in text
    assert "--allow-config-change" in text and "train.steps" not in text.split("Keys that may")[0]
    assert sorted(p.name for p in run.glob("config*.yaml")) == ["config.yaml"]

    rc, text = _train(tmp_path, capsys, "train.steps=2", "train.lr=0.01", "--resume", "--allow-config-change")
    assert rc == 0, text
    assert "resumed from" in text and "config-resume-1.yaml" in text
    assert (run / "config.yaml").read_bytes() == first  # the first config is never overwritten
    kept = yaml.safe_load((run / "config-resume-1.yaml").read_text())
    assert kept["train"]["lr"] == 0.01 and kept["train"]["steps"] == 2
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]

    # more steps (a free key) need no flag; the new lr is now the run's: no flag either
    rc, text = _train(tmp_path, capsys, "train.steps=3", "train.lr=0.01", "--resume")
    assert rc == 0, text
    assert (run / "config-resume-2.yaml").is_file()
    from sparserl.train.run_folder import recorded_configs

    assert [p.name for p in recorded_configs(run)] == ["config.yaml", "config-resume-1.yaml", "config-resume-2.yaml"]


def test_resume_uses_the_runs_own_config_and_the_newest_run(tmp_path, capsys, one_step_run, monkeypatch):
    # no CONFIG argument: the run's recorded config, the overrides on top, no flag needed
    rc, text = run_cli(["train", "--resume", "--run-dir", str(one_step_run), "train.steps=2"], capsys)
    assert rc == 0, text
    assert "resumed from" in text
    # no --run-dir: the newest run under log.out_dir, said so
    rc, text = run_cli(["train", "--resume", f"log.out_dir={tmp_path}", "train.steps=3"], capsys)
    assert rc == 0, text
    assert f"resuming the newest run under {tmp_path}: {one_step_run}" in text
    steps = [json.loads(x)["step"] for x in (one_step_run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]


def test_resume_falls_back_over_a_corrupt_checkpoint(tmp_path, capsys, one_step_run):
    rc, text = _train(tmp_path, capsys, "train.steps=2", "--resume")
    assert rc == 0, text
    newest = one_step_run / "checkpoints" / "step-000002" / "model" / "model.safetensors"
    newest.write_bytes(newest.read_bytes()[:100])  # truncated
    rc, text = _train(tmp_path, capsys, "train.steps=2", "--resume")
    assert rc == 0, text
    assert f"{newest}: truncated or corrupt" in text and "falling back to" in text
    assert "resumed from" in text and "step-000001" in text


@pytest.mark.parametrize(
    "argv,culprit",
    [
        (["--quant", "int4"], "int4"),
        (["--quant", "int8", "--quant-group", "64"], "--quant-group"),
        (["--quant", "int8_group", "--quant-group", "6"], "multiple of 4"),
        (["--quant", "int8", "--quant-smooth", "1.5"], "--quant-smooth"),
        (["--quant", "int8", "--quant-outliers", "-1"], "--quant-outliers"),
        (["--kv-quant", "int3"], "int3"),
        (["--compressor", "rkvv"], "rkvv"),
    ],
)
def test_profiler_options_fail_before_the_model_loads(argv, culprit, monkeypatch, capsys):
    """``python -m sparserl.rollout.profile``: a bad option is one line on stderr and exit 2; the
    model is never loaded."""
    from sparserl.rollout import profile as profile_mod

    def no_load(*a, **kw):
        raise AssertionError("the model was loaded before the options were checked")

    monkeypatch.setattr("sparserl.models.loading.load_model", no_load)
    assert profile_mod.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and culprit in err and "Traceback" not in err
