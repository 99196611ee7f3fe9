"""The configuration's schema: eleven pydantic sections of documented, range-checked fields.

Why pydantic v2 (not OmegaConf): each field's type, default, bounds and help text sit in one
``Field``; one ``ValidationError`` collects every problem of a file at once; and plain YAML plus
dotted overrides need no resolver/interpolation language.

This module imports neither torch nor any sparserl implementation module, so the command line, the
help and the docs can read the schema cheaply. A field checked against a registry (compressor, weight
and KV quantization, advantage estimator, correction) looks its names up when a value is checked, by an
import inside the check: importing the schema loads nothing heavy, building a ``Config`` does.
Each value is checked as it is set (type, range, choice, registered name); the rules that tie keys
together are :mod:`sparserl.config.rules`'.
"""

from __future__ import annotations

import math
import re
import typing
from collections.abc import Callable, Iterable
from typing import Annotated, Any, Literal, Union

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from ..registry import did_you_mean

__all__ = [
    "ModelConfig",
    "KVControllerConfig",
    "RolloutConfig",
    "DataConfig",
    "OverlongBufferConfig",
    "RewardConfig",
    "DistillSparseConfig",
    "AlgorithmConfig",
    "TrainConfig",
    "LogConfig",
    "CheckpointConfig",
    "EvalConfig",
    "MismatchConfig",
    "ClusterConfig",
    "Config",
    "SECTIONS",
    "FLOAT32_MAX",
    "QUANT_GROUP",
    "fields_of",
    "field_at",
    "subsection",
    "type_name",
    "strip_annotated",
    "Registered",
]


# --- the registries' names, looked up when a value is checked --------------------------------------
def _compressors() -> list[str]:
    from ..rollout.kv import available_compressors

    return available_compressors()


def _quants() -> list[str]:
    from ..rollout.quant import available_quants

    return available_quants()


def _kv_quants() -> list[str]:
    from ..rollout.kv_quant import available_kv_quants

    return available_kv_quants()


def _adv_ests() -> list[str]:
    from ..advantages import available_adv_ests

    return available_adv_ests()


# --- field types and checks ----------------------------------------------------------------------
def _check(ok: Callable[[Any], Any], msg: str) -> AfterValidator:
    """A field check: ``msg`` names the problem when ``ok(value)`` is false."""

    def check(v: Any) -> Any:
        if not ok(v):
            raise ValueError(msg)
        return v

    return AfterValidator(check)


class Registered:
    """Field check: the value is one of a registry's names (``names()``: the registry's one list)."""

    def __init__(self, kind: str, names: Callable[[], list[str]]):
        self.kind, self.names = kind, names

    def __call__(self, v: str) -> str:
        if v not in (valid := self.names()):
            raise ValueError(f"not a registered {self.kind}{did_you_mean(v, valid)}; registered: {', '.join(valid)}")
        return v


def _correction(v: Any) -> Any:
    if not v:
        raise ValueError("must not be empty (use 'none')")
    from ..correct.presets import resolve

    try:
        resolve(v)  # the error lists the presets, the methods and the closest name
    except TypeError as e:
        raise ValueError(str(e)) from e
    return v


# numbers given to a string field keep their text (run_name: 2024); mapping keys are strings
Str = Annotated[str, BeforeValidator(lambda v: str(v) if type(v) in (int, float) else v)]
NonEmpty = Annotated[Str, _check(bool, "must not be empty")]
Options = Annotated[
    dict[str, Any], BeforeValidator(lambda v: {str(k): x for k, x in v.items()} if isinstance(v, dict) else v)
]
Compressor = Annotated[str, AfterValidator(Registered("compressor", _compressors))]
Quant = Annotated[str, AfterValidator(Registered("weight quantization", _quants))]
KVQuant = Annotated[str, AfterValidator(Registered("KV-cache quantization", _kv_quants))]
AdvEstimator = Annotated[str, AfterValidator(Registered("advantage estimator", _adv_ests))]
Correction = Annotated[Str | list, AfterValidator(_correction)]
Device = Annotated[
    str,
    _check(
        lambda v: v in ("auto", "cpu", "mps") or re.fullmatch(r"cuda(:\d+)?", v), "is not auto, cpu, cuda or cuda:N"
    ),
]
Folder = Annotated[
    Str | None,
    _check(lambda v: v is None or ("/" not in v and v not in ("", ".", "..")), "must be a plain folder name"),
]
Beta = Annotated[float, Field(ge=0, lt=1)]
Tokens = Annotated[int, Field(ge=1)]
Betas = Annotated[tuple[Beta, Beta], BeforeValidator(lambda v: tuple(v) if isinstance(v, list) else v)]


def _lora_target(v: Any) -> Any:
    if v == "all-linear" or (isinstance(v, list) and v and all(isinstance(x, str) and x for x in v)):
        return v
    raise ValueError("expected all-linear or a non-empty list of module names (e.g. [q_proj, v_proj])")


LoraTarget = Annotated[Any, AfterValidator(_lora_target)]


#: the largest finite float32 (torch.finfo(torch.float32).max): every number of the config reaches torch as float32
FLOAT32_MAX = float.fromhex("0x1.fffffep+127")

#: inputs per scale of rollout.quant=int8_group by default (sparserl.rollout.quant.int8_group.GROUP; a test
#: holds the two equal)
QUANT_GROUP = 64


def _floats(v: Any) -> Iterable[float]:
    """The floats in a field's value, inside lists, tuples and mappings too."""
    if isinstance(v, float):
        yield v
    elif isinstance(v, (list, tuple)):
        for x in v:
            yield from _floats(x)
    elif isinstance(v, dict):
        for x in v.values():
            yield from _floats(x)


def _within_float32(v: Any) -> Any:
    """Every field's check: each float of the value is finite and within float32's range."""
    for x in _floats(v):
        if not (math.isfinite(x) and abs(x) <= FLOAT32_MAX):
            which = "" if x is v else f"{x!r} "
            raise ValueError(
                f"{which}must lie within float32's finite range, ±{FLOAT32_MAX:.8g} (numbers reach torch as float32)"
            )
    return v


def F(default: Any = None, help: str = "", factory: Any = None, **bounds: Any) -> Any:
    """A field with its help text (``description``), bounds (ge/gt/le/lt) and default or factory."""
    if factory is not None:
        return Field(default_factory=factory, description=help, **bounds)
    return Field(default, description=help, **bounds)


#: the error a failed assignment raises (``cfg.rollout.kv_budget = 0``), given pydantic's error and the
#: section's key: :mod:`sparserl.config.messages` installs its ConfigError with one line per problem, so that
#: the schema needs nothing from the modules that read it
assignment_error: Callable[[ValidationError, tuple], Exception] | None = None


class _Section(BaseModel):
    """Unknown keys, wrong types and out-of-range values are errors, also on assignment; every
    float anywhere in a section lies within float32's finite range."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, validate_default=True, strict=True)

    _float32 = field_validator("*")(_within_float32)

    def __setattr__(self, name: str, value: Any) -> None:
        try:
            super().__setattr__(name, value)
        except ValidationError as e:  # cfg.rollout.kv_budget = 0 -> a ConfigError naming the key
            sec = next((k for k, c in SECTIONS.items() if c is type(self)), None)
            if assignment_error is None:
                raise
            raise assignment_error(e, (sec,) if sec else ()) from None


# --- sections ------------------------------------------------------------------------------------
class ModelConfig(_Section):
    """Which policy to train, and in what precision."""

    name: NonEmpty = F(
        "smollm2-135m",
        "Model: a built-in name ('smollm2-135m', the embedded default; 'tiny', "
        "a small random model for tests), a local Hugging Face folder, or a .gguf file.",
    )
    dtype: Literal["float32", "bfloat16"] = F(
        "float32", "Learner (trained weights) dtype: float32 | bfloat16. The dense scorer uses the same dtype."
    )
    mixed_precision: Literal["auto", "off", "bfloat16"] = F(
        "auto",
        "The learner's forwards and backward in bfloat16 under torch.autocast, its weights, gradients and "
        "AdamW state in float32 (TRL's bf16=True, verl's FSDP mixed precision): auto (bfloat16 where this "
        "machine runs it measurably faster, timed once and cached) | off | bfloat16. With model.dtype=float32 "
        "only. `sparserl bench learner` measures the whole step.",
    )
    seed: int = F(0, "Seed of the random initialisation of a 'tiny' model (ignored for real models).")
    device: Device = F("auto", "Device: auto (cuda if available, else cpu) | cpu | cuda | cuda:N.")


def _schedule_pairs(v: Any) -> Any:
    """A schedule given inline is checked here (a file is read by ``validate``)."""
    if isinstance(v, list):
        from ..rollout.kv.schedule import ScheduleError, parse_pairs

        try:
            parse_pairs(v, "kv_schedule")
        except ScheduleError as e:
            raise ValueError(str(e).removeprefix("kv_schedule")) from None
    return v


Schedule = Annotated[Str | list | None, AfterValidator(_schedule_pairs)]


class KVControllerConfig(_Section):
    """The online budget controller (sparserl.train.kv_controller): each length bin's KV budget is raised
    or lowered between training steps from the measured α tail (mismatch/alpha_p5_bin/<start>)."""

    threshold: float = F(
        0.86,
        "Sparrow's threshold on the 5th percentile of α per length bin: a bin below it gets "
        "more KV (Sparrow: training stayed stable above ~0.86).",
        gt=0,
        le=1,
    )
    margin: float = F(
        0.04,
        "Hysteresis: a bin's budget is lowered only while its α tail stays at or above threshold + margin.",
        ge=0,
        lt=1,
    )
    patience: int = F(
        2, "Steps in a row a bin's α tail must clear threshold + margin before its budget is lowered.", ge=1
    )
    bin: int | None = F(
        None,
        "Width in tokens of the sequence-length bins; None = mismatch.alpha_bin (the bins "
        "α is measured on; another width is an error).",
        ge=1,
    )
    min_budget: int = F(16, "Smallest budget a bin may get.", ge=1)
    max_budget: int = F(256, "Largest budget a bin may get (sizes the sampler's buffers).", ge=1)
    step: int = F(8, "Tokens a bin's budget moves by at one adjustment.", ge=1)


class RolloutConfig(_Section):
    """The sampler: how responses are generated and how its KV cache is compressed."""

    compressor: Compressor = F(
        "rkv",
        "KV-cache compressor of the sampler, a registered name: none (dense) | streaming | snapkv | rkv | h2o | ...",
    )
    kv_budget: int = F(64, "KV budget B in tokens per sequence (per layer) kept by the compressor.", ge=1)
    trigger: Literal["step_length", "newline"] = F(
        "step_length",
        "When to compress: step_length (every `step_length` decode steps once the cache "
        "exceeds the budget) | newline (after a newline token).",
    )
    step_length: int = F(32, "Decode steps between two compressions (R-KV / Sparse-RL: 128).", ge=1)
    window: int = F(
        8, "Observation window w: the last w tokens are always kept and their queries score the others (R-KV: 8).", ge=0
    )
    compress_prompt: bool = F(False, "Also compress the prompt's KV (R-KV leaves it whole).")
    tail_slack: int = F(
        0,
        "Spare KV slots past kv_budget + step_length: a compression due when the rest of "
        "the generation fits in them is skipped (it could not pay for its scoring). 0 = the "
        "buffer is exactly kv_budget + step_length.",
        ge=0,
    )
    compressor_options: Options = F(
        help="Method-specific options, passed to the compressor as keyword "
        "arguments: e.g. lam, kernel, threshold, per_head, sinks.",
        factory=dict,
    )
    kv_schedule: Schedule = F(
        None,
        "Sparrow's sparsity schedule: the KV budget as a function of the sequence length "
        "(prompt + tokens generated), [[length, budget], ...] with lengths increasing, or a JSON "
        "file (such pairs, or `sparserl calibrate`'s output: the schedule of rollout.compressor). "
        "Replaces kv_budget; the buffers hold the largest budget. None = the fixed kv_budget.",
    )
    blocktopk_pages: int | None = F(
        None,
        "Block top-k (rollout.compressor=blocktopk): pages of 16 tokens each decode "
        "step reads per layer and KV head, the first page and the last 2 among them "
        "(layers 0 and 1 read every page). Wins over kv_budget (tokens read = 16 x "
        "pages); None = kv_budget / 16, or with kv_schedule its budget / 16. At least 3.",
    )
    kv_controller: KVControllerConfig | None = F(
        None,
        "The online budget controller (threshold, margin, patience, "
        "bin, min_budget, max_budget, step); it starts from kv_schedule, "
        "else kv_budget in every bin. None = off.",
    )
    n: int = F(8, "Samples (responses) per prompt; GRPO needs n >= 2.", ge=1)
    temperature: float = F(1.0, "Sampling temperature (0 = greedy).", ge=0)
    top_p: float = F(1.0, "Nucleus sampling: keep the smallest set of tokens with this mass (1 = off).", gt=0, le=1)
    top_k: int = F(0, "Keep only the k most likely tokens (0 = off).", ge=0)
    max_new_tokens: int = F(96, "Maximum response length in tokens.", ge=1)
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = F(
        "bfloat16", "Sampler dtype: auto | float32 | bfloat16 | float16."
    )
    quant: Quant = F(
        "none",
        "The sampler's weight quantization (the learner stays in full precision; "
        "re-quantized at every weight push): none | int8 (W8A8, QuRL) | int8_group (W8A8 with "
        "weight and activation scales per group of 64 inputs: more accurate) | int8_weight_only | fp8 "
        "(E4M3, FP8-RL; emulated where the device has no FP8 matmul).",
    )
    kv_quant: KVQuant = F(
        "none",
        "How the sampler's KV cache stores K and V: none | int8 | fp8 (1 byte per "
        "element plus a float32 scale per token and KV head).",
    )
    quant_scale: float = F(
        1.0,
        "QuRL's invariant scaling s: before training, W X = (W/s)(s X) with s folded "
        "into the RMSNorms before q/k/v and gate/up (learner and sampler alike; full-precision "
        "function unchanged, checkpoints keep the original form). QuRL: 1.5.",
        gt=0,
    )
    quant_smooth: float = F(
        0.0,
        "SmoothQuant's migration strength a (sampler only): per input channel s_j = "
        "max|X_j|^a / max|W_j|^(1-a), X W^T = (X/s)(W s)^T, so activation outliers move into "
        "the weights before W8A8; the activation maxima are calibrated on a fixed text at every "
        "push. 0 = off (QuRL/FP8-RL as published); 0.5 = the paper's default. Needs "
        "rollout.quant int8, int8_group or fp8.",
        ge=0,
        lt=1,
    )
    quant_outliers: int = F(
        0,
        "Input channels of every quantized linear kept in float32 (LLM.int8's mixed-precision "
        "decomposition, with the channels fixed per push as QUIK does): the k inputs of largest "
        "max|X_j| on the calibration text (after SmoothQuant's division when that is on), "
        "re-chosen at every push; the rest quantized with scales over them alone. 0 = off "
        "(QuRL/FP8-RL as published). Needs rollout.quant int8, int8_group or fp8.",
        ge=0,
    )
    quant_head: bool = F(
        False,
        "Quantize the sampler's LM head too, with rollout.quant (and its SmoothQuant factors "
        "and outlier channels, calibrated on the final norm's output). The head is ~20% of a "
        "quantized decode step of SmolLM2-135M in float32; plain per-token int8 on it costs "
        "acceptance, with outlier channels little (docs/results/smoothquant.md). Off: the head "
        "stays in rollout.dtype, as QuRL/FP8-RL keep it.",
    )
    fp32_head: bool = F(
        False,
        "The sampler's LM head in float32 under a bfloat16 or float16 sampler (after prime-rl's enable_fp32_lm_head "
        "and SGLang's --enable-fp32-lm-head, which keep the half-precision weight and output float32 logits): a "
        "float32 copy of the learner's head weight and a float32 product from the final norm's output, so the "
        "sampler's head is a float32 learner's (+ vocabulary x hidden x 8 bytes, the weight and its packed copy for "
        "the decode kernel: 226 MB for SmolLM2). On this "
        "CPU's fused bf16 step the bf16 head already sums in float32 and returns float32 logits; what this adds is "
        "the weight's precision. Refused with a float32 sampler (nothing to do) and with rollout.quant_head.",
    )
    quant_group: int = F(
        QUANT_GROUP,
        "Inputs per scale of rollout.quant=int8_group, for the weights (per output "
        "and group) and the activations (per token and group); a multiple of 4: smaller groups "
        "follow outlier channels more closely, at a little more cost. Only with int8_group.",
        ge=4,
    )
    mismatch_split: bool = F(
        False,
        "Also score the responses with the sampler's quantized weights on a dense "
        "full-precision cache and log the mismatch's two parts: mismatch/k3_kl_weights "
        "(quantization) and mismatch/k3_kl_cache (eviction, KV rounding). Needs rollout.quant; "
        "costs one teacher-forced forward of the sampler per step.",
    )
    async_: bool = Field(
        False,
        alias="async",
        description=(
            "One-step-asynchronous rollouts (verl's one-step-off): the rollout workers sample step k + 1 with the "
            "weights before step k's update while the learner updates on step k; the learner scores the old "
            "policy itself and the corrections treat the one step of lag like any other mismatch "
            "(mismatch/policy_lag_steps; k3 and α split into mismatch/k3_kl_lag and mismatch/k3_kl_cache, "
            "mismatch/alpha_lag_* and mismatch/alpha_cache_*). The step after a checkpoint samples with fresh "
            "weights, so that a resumed run is exact. Needs cluster.rollout_workers."
        ),
    )
    max_staleness: int = F(
        1,
        "Under rollout.async: how many steps ahead the rollout workers sample (verl's staleness_threshold, SkyRL's "
        "max_staleness_steps, AReaL's max_head_offpolicyness, TRL's max_staleness): step t's rollout is sent during "
        "step t - k with the weights after update t - k - 1, so no batch is sampled more than k weight pushes before "
        "the update that learns from it (mismatch/policy_lag_steps). Steps are sent and taken in order, so the same "
        "seed gives the same run; none is sent past a checkpoint's step (a resumed run samples what the straight run "
        "did). 1 = one-step-off; 0 = each step's rollout sent when the step starts.",
        ge=0,
    )
    partial: bool = F(
        False,
        "Partial rollouts (verl's async_training.partial_rollout, slime's --partial-rollout): under rollout.async a "
        "rollout sent j > 1 steps ahead is sampled in j segments of ⌈max_new_tokens / j⌉ decode steps, the first "
        "with the weights it was sent with and each of the others after one of the next weight pushes with that "
        "push's weights (the responses not yet ended go on, their KV cache kept: under a compressing cache the "
        "tokens it kept were chosen under the older weights). Each token records the push that drew it "
        "(mismatch/policy_lag_tokens_mean); the corrections read each token's own sampler log-prob. Segments are "
        "cut by decode steps, not by when a push arrives, so the same seed gives the same run. With "
        "rollout.max_staleness 0 or 1 no rollout spans a push and the run equals the one without.",
    )
    oversample: int | None = F(
        None,
        "Sparrow's acceptance-aware oversampling (force_select_repeat with force_select_repeat_use_acceptance_rate): "
        "sample this many responses per prompt (> rollout.n) and keep, per prompt, the rollout.n with the highest "
        "mean acceptance, mean_t min(1, p_t / q_t) of the sampled tokens (the expectation of Sparrow's per-token "
        "Bernoulli draw), once the old policy's log-probs are known (sampling/oversample_acceptance_kept and "
        "_dropped). Costs the extra responses' rollout and old-policy forward. None = off.",
        ge=2,
    )
    oversample_by: Literal["acceptance", "reward"] = F(
        "acceptance",
        "What rollout.oversample keeps: the responses with the highest mean acceptance, or with the highest reward "
        "(Sparrow's default selection).",
    )
    dense_fallback: bool = F(
        False,
        "Sparrow's dense fallback (dense_filtering_overload): each group of a step whose rewards are all 0 is "
        "sampled again, once, by the same weights on a dense KV cache, scored, and put in the sparse group's "
        "place (sampling/dense_fallback_frac, sampling/dense_fallback_reward_mean; reward/mean stays the "
        "compressed sampler's). Costs a dense rollout of those groups; needs a compressing sampler and a "
        "synchronous one.",
    )
    partial_kv: Literal["keep", "recompute"] = F(
        "keep",
        "Under rollout.partial, the KV cache of the responses still running when new weights are loaded: keep (as "
        "it is: the K/V of the tokens before were computed with the older weights) or recompute (NeMo-RL's "
        "recompute_kv_cache_after_weight_updates: one forward with the new weights over each response so far "
        "replaces the K/V of the tokens the cache holds and gives the next token's logits; a compressing cache "
        "keeps the tokens it chose under the older weights). recompute costs a prefill of every live response at "
        "each load.",
    )
    join_rollouts: bool = F(
        False,
        "Under rollout.partial: the rollouts in flight on a worker share one batch (continuous batching across the "
        "steps of the run, sparserl.rollout.stream): the rows of the rollout sent last start beside the tail of the "
        "ones sent before, in the places their ended rows freed, and each push's decode steps run every rollout's "
        "rows at once (⌈max_new_tokens / j⌉ steps at least, until the rollouts sent before have ended) instead of "
        "one rollout after another. Each token still records the push that drew it. All rollouts of the batch use "
        "the KV budgets of the last one sent.",
    )
    partial_max_lag: int | None = F(
        None,
        "Under rollout.partial: tokens drawn more than this many weight pushes before the update that learns from "
        "them are masked out of the loss (slime's --mask-offpolicy-in-partial-rollout; rollout/stale_masked_frac): "
        "from 1 (the freshest tokens are 1 push old when their step takes them) to rollout.max_staleness - 1. "
        "None = none masked.",
        ge=0,
    )
    compile: bool = F(
        False,
        "torch.compile the sampler's decode step (inductor: C++ on CPU, Triton on CUDA; "
        "the first step compiles, ~20 s per graph on 2 cores); measure with `sparserl bench "
        "rollout --compile` before turning it on.",
    )
    static_step: bool = F(
        False,
        "Decode on the fixed-shape step that reads nothing back to the host (sparserl.rollout.static_step): "
        "attention over the cache's capacity, masked on the device; finished rows refilled with waiting responses; "
        "on CUDA the step replayed as a captured CUDA graph with Triton's attention. Built for GPUs (not yet "
        "measured on one); on a CPU the eager step is faster. Block top-k, stop strings and the newline trigger "
        "keep the eager step.",
    )
    static_check_every: int = F(
        8,
        "With rollout.static_step: decode steps between the host's reads of the rows' done and compression-due "
        "flags (a bounded cache gets this many slots more, for the tokens written before a due flag is read).",
        ge=1,
    )
    stop: list[NonEmpty] = F(
        help="Stop strings: generation of a response ends after any of them (EOS always stops).", factory=list
    )

    @property
    def quantized(self) -> bool:
        """The sampler's weights or KV cache are quantized (it then never runs the old policy exactly)."""
        return self.quant != "none" or self.kv_quant != "none"


class DataConfig(_Section):
    """Prompts and labels for training and evaluation."""

    train: NonEmpty = F(
        "arith",
        "Training set: a built-in task name ('arith', options as 'arith:digits=1,"
        "terms=2'), a data set name, or a local .jsonl/.json/.parquet path.",
    )
    eval: Str | None = F(None, "Evaluation set (same forms as `train`); None = no evaluation.")
    prompt_key: NonEmpty | None = F(None, "Column holding the prompt (None = guess: problem, question, prompt...).")
    label_key: NonEmpty | None = F(None, "Column holding the reference answer (None = guess: answer, solution...).")
    eval_prompt_key: NonEmpty | None = F(
        None,
        "Column holding the prompt in the evaluation set (None = data.prompt_key "
        "where the evaluation file has that column, else a built-in set's own or a "
        "guess).",
    )
    eval_label_key: NonEmpty | None = F(
        None,
        "Column holding the reference answer in the evaluation set (None = "
        "data.label_key where the evaluation file has that column, else a built-in "
        "set's own or a guess).",
    )
    template: Str | None = F(
        None,
        "Prompt template with {prompt} (None = the model's chat template when it has one, else the task's default).",
    )
    system_prompt: Str | None = F(None, "System message prepended when a chat template is used.")
    skip_bad_rows: bool = F(False, "Skip rows without prompt or label instead of failing.")
    limit: int | None = F(None, "Use only the first `limit` training rows (None = all).", ge=1)
    eval_limit: int | None = F(64, "Use only the first `eval_limit` evaluation rows (None = all).", ge=1)


class OverlongBufferConfig(_Section):
    """DAPO's soft overlong punishment (sparserl.reward.overlong; verl's reward_model.overlong_buffer)."""

    len: int = Field(
        description="L_cache: the last this many tokens up to rollout.max_new_tokens are the buffer where "
        "the length penalty falls linearly from 0 to -penalty_factor (DAPO: 4,096 of 20,480).",
        ge=1,
    )
    penalty_factor: float = F(1.0, "The penalty at rollout.max_new_tokens, where a response is cut (DAPO: 1).", ge=0)


class RewardConfig(_Section):
    """The verifier."""

    fn: NonEmpty | list[NonEmpty] = F(
        "math",
        "Reward function: a built-in name ('math': 1 if the final / boxed answer equals the label, else 0) or "
        "'module:function' taking (response, label[, prompt]); prompt is the problem as the model was asked it (its "
        "last user message, after data.template). A list sums several, weighted by reward.weights (TRL's "
        "reward_funcs); the first is the verifier held-out pass@k reads.",
    )
    weights: list[float] | None = F(
        None, "One weight per reward of reward.fn: R = sum of w_k r_k (TRL's reward_weights); None = 1 each."
    )
    timeout_s: float = F(
        5.0,
        "Seconds allowed to verify one response (in a checker process) before "
        "it scores 0 (at most a day: the checker's timer takes no more than ~1e9 s).",
        gt=0,
        le=86400,
    )
    overlong_buffer: OverlongBufferConfig | None = F(
        None,
        "DAPO's soft overlong punishment, {len, penalty_factor}: a response longer than rollout.max_new_tokens - "
        "len tokens gets penalty_factor x (max_new_tokens - len - length) / len added to its reward, -penalty_factor "
        "at the limit (verl's reward_model.overlong_buffer, TRL's soft_overlong_punishment); logged as "
        "reward/part/overlong. None = off.",
    )


class DistillSparseConfig(_Section):
    """DistillSparse (Sparrow, Zhou et al., 2026): LoRA weights φ on the sparse sampler only, trained after
    each update with θ frozen (sparserl.train.distill_sparse)."""

    rank: int = Field(description="LoRA rank of φ (Sparrow: must be set).", ge=1)
    lambda_: float = Field(
        0.001,
        alias="lambda",
        ge=0,
        description=(
            "λ of L = L_PPO^sparse + λ·KL(q_φ ‖ p): the weight of the k3 estimate of the sampler's KL to the "
            "dense policy (Sparrow: 0.001)."
        ),
    )
    lr: float = F(1e-4, "Learning rate of φ (AdamW, the learner's betas and eps).", gt=0)
    alpha: int = F(16, "LoRA alpha of φ (scale alpha / rank; Sparrow: 16).", gt=0)
    target: LoraTarget = F("all-linear", "Linear modules that get φ: all-linear or a list of module names.")


class AlgorithmConfig(_Section):
    """Advantages, policy loss and the correction of the sampler/dense mismatch."""

    adv_estimator: AdvEstimator = F(
        "grpo",
        "Advantage estimator, a registered name: grpo ((R - mean) / std "
        "within the group) | dr_grpo (R - mean, no std) | rloo (leave-one-out).",
    )
    scale_rewards: Literal["group", "batch", "none"] = F("group", "Std used to scale advantages: group | batch | none.")
    loss_agg: Literal["seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm"] = F(
        "seq_mean_token_mean",
        "Loss aggregation: seq_mean_token_mean (mean over a response's tokens, then over "
        "responses) | token_mean (over all tokens) | seq_mean_token_sum_norm (token sum / max length, Dr. GRPO).",
    )
    clip_eps: float = F(0.2, "PPO clip range epsilon: the ratio pi/p is clipped to [1-eps, 1+eps_high].", gt=0)
    clip_eps_high: float | None = F(None, "Upper clip epsilon (DAPO 'clip higher'); None = clip_eps.", gt=0)
    importance_sampling_level: Literal["token", "sequence"] = F(
        "token",
        "The PPO ratio pi/p per token, or per response: sequence = GSPO (TRL's importance_sampling_level, "
        "verl's loss_mode=gspo), the response's length-normalised ratio on every token; GSPO clips at "
        "clip_eps=3e-4, clip_eps_high=4e-4.",
    )
    kl_coef: float = F(
        0.0,
        "Coefficient of the KL penalty to the reference (initial) model; 0 = no reference "
        "model is kept (Sparse-RL: 1e-4).",
        ge=0,
    )
    kl_kind: Literal["k1", "k2", "k3", "low_var_kl"] = F(
        "low_var_kl", "KL estimator: k1 | k2 | k3 | low_var_kl (k3, clamped)."
    )
    kl_unbiased: bool = F(
        False,
        "The KL penalty's per-token estimate times the PPO ratio pi_theta / pi_old (not detached): the unbiased "
        "KL estimate of DeepSeek-V3.2 (TRL's use_bias_correction_kl), for tokens drawn by the old policy rather "
        "than the current one. Needs kl_coef > 0.",
    )
    off_policy_mask_threshold: float | None = F(
        None,
        "DeepSeek-V3.2's off-policy sequence masking (TRL's off_policy_mask_threshold, delta): a response with a "
        "negative advantage whose mean over its tokens of log q - log pi_theta (the sampler's log-probs against "
        "the current policy's, in every update micro-batch) exceeds this is left out of the policy loss (weight "
        "0; rs/off_policy_masked_frac). TRL suggests 0.5 to start. None = off.",
        ge=0,
    )
    entropy_coef: float = F(0.0, "Coefficient of the entropy bonus (0 = off).", ge=0)
    filter_groups: bool = F(
        False,
        "DAPO's dynamic sampling (verl's filter_groups): sample further batches of "
        "train.prompts_per_step prompts until that many groups have rewards that differ (a group "
        "of equal rewards has advantage 0), at most max_gen_batches, and train on the first ones; "
        "short of them, groups of equal rewards fill the step. Logs sampling/gen_batches.",
    )
    max_gen_batches: int = F(4, "At most this many batches sampled in a step under filter_groups.", ge=1)
    mask_truncated: bool = F(
        False,
        "Leave responses cut at rollout.max_new_tokens (finish reason 'length') out of "
        "the loss and the corrections, as TRL's mask_truncated_completions and DAPO's overlong "
        "filtering; their rewards still count in their group's advantages "
        "(response/clipped_frac logs how many).",
    )
    correction: Correction = F(
        "sparse_rl",
        "Mismatch correction: a preset or method name from sparserl.correct "
        "(e.g. sparse_rl, naive, none, tis, mis, qurl), or a list of method names / "
        "[name, {options}] pairs.",
    )
    correction_options: Options = F(
        help="Options of the correction overriding the preset's defaults (e.g. token_low, token_high, veto, is_cap).",
        factory=dict,
    )
    old_logprobs: Literal["auto", "score", "sampler", "update"] = F(
        "auto",
        "Where the old policy's log-probs come from: score (a no-grad forward of the learner before the "
        "update) | sampler (the sampler's own; only when it runs the old policy exactly: rollout.compressor=none, "
        "temperature > 0, top_p=1, top_k=0, float32 sampler and learner) | update (the update's own forward, "
        "detached, as TRL with num_iterations=1; only when the step is one optimizer step over one micro-batch: "
        "ppo_epochs=1, the whole batch per mini-batch and per micro-batch, one learner, no dropout) | auto "
        "(sampler when that holds, else update when that holds, else score).",
    )

    distill_sparse: DistillSparseConfig | None = F(
        None,
        "DistillSparse (Sparrow): {rank, lambda, lr}: LoRA weights φ on the sparse sampler only; after each "
        "update, θ frozen, φ minimises L_PPO^sparse + λ·k3 KL(q_φ ‖ p) through a replay of the sampler's "
        "attention; the learner and the dense scorer never see φ. Logs mismatch/alpha_p5 (with φ) and "
        "mismatch/alpha_p5_nophi. Needs a sparse sampler and mismatch.alpha=exact. None = off.",
    )

    @property
    def clip_eps_upper(self) -> float:
        """The effective upper clip epsilon (clip_eps_high, or clip_eps when unset)."""
        return self.clip_eps if self.clip_eps_high is None else self.clip_eps_high


class TrainConfig(_Section):
    """The RL loop and the optimizer."""

    steps: int = F(20, "RL steps (one rollout batch each).", ge=1)
    prompts_per_step: int = F(8, "Prompts per rollout batch (each sampled rollout.n times).", ge=1)
    mini_batch_prompts: int | None = F(
        None,
        "Prompts per optimizer update; None = all: one update per "
        "rollout batch (on-policy); smaller = several updates.",
        ge=1,
    )
    ppo_epochs: int = F(1, "Passes over each rollout batch.", ge=1)
    micro_batch_size: int = F(
        8, "Sequences per forward/backward (gradient accumulation inside a mini-batch); lower it to save memory.", ge=1
    )
    max_tokens_per_micro_batch: Tokens | Literal["auto"] | None = F(
        "auto",
        "Token budget of a micro-batch (verl's ppo_max_token_len_per_gpu with use_dynamic_bsz): the update's and the "
        "scoring's micro-batches are packed by length so that each holds at most this many tokens (prompt + response, "
        "padded to the micro-batch's longest; each distinct prompt once under train.shared_prompt) and at most "
        "train.micro_batch_size sequences; None = sequences only. auto = 4096 when a whole rollout batch at its "
        "longest fits it (then the update's own forward gives the old policy's log-probs: one forward a step fewer), "
        "else 2048, or one whole row (rollout.max_new_tokens + a 512-token prompt) where that is more: at 32 x 1,024 "
        "tokens 2048 peaks at 7.0-7.4 GB over a run instead of 9.6 for 1.08x the update's compute "
        "(docs/results/memory_over_a_run). The resolved number is what `sparserl config` prints.",
    )
    gradient_checkpointing: bool | Literal["auto"] = F(
        "auto",
        "Recompute each decoder layer's activations in the backward instead of keeping them (transformers' "
        "gradient checkpointing): less memory, ~1/3 more learner compute. auto = on when the step's predicted peak "
        "memory would not fit without it (sparserl.memory).",
    )
    max_memory_gb: float | None = F(
        None,
        "The memory a run may use, in GB (10^9 bytes): a configuration whose predicted peak (sparserl.memory: resident "
        "parts + the step's largest station, printed by `sparserl config`) exceeds it is refused before the model "
        "loads, naming the keys that would make it fit. None = the machine's available memory now (MemAvailable + "
        "this process's RSS) less 10% (at least 0.5 GB).",
        gt=0,
    )
    trim_heap: bool = F(
        True,
        "Hand the C heap's freed pages back to the kernel (glibc's malloc_trim) after the rollout, before the update, "
        "after each update micro-batch and at each step's end (sparserl.memory.allocator): the run's peak follows its "
        "live tensors (32 x 1,024 dense: 9.6 GB held instead of growing to 12.0 in four steps) for 1.04-1.14x the "
        "update's compute (docs/results/memory_over_a_run); false = leave them to the allocator. No effect off glibc.",
    )
    shared_prompt: bool = F(
        True,
        "Forward each distinct prompt of a micro-batch once and only the responses "
        "after it (its K/V shared by the group's rows): the same log-probs and gradients "
        "with fewer tokens through the model; false = every row whole.",
    )
    lr: float = F(1e-5, "Learning rate (AdamW).", gt=0)
    weight_decay: float = F(0.0, "AdamW weight decay.", ge=0)
    betas: Betas = F((0.9, 0.98), "AdamW betas.")
    eps: float = F(1e-8, "AdamW epsilon.", gt=0)
    grad_clip: float | None = F(1.0, "Clip the gradient's global norm to this (None or 0 = no clipping).", ge=0)
    warmup_steps: int = F(
        0,
        "Linear learning-rate warm-up over this many optimizer updates (not RL steps: a "
        "step makes ppo_epochs x prompts_per_step / mini_batch_prompts); train.lr_scheduler after.",
        ge=0,
    )
    lr_scheduler: Literal["constant", "linear", "cosine"] = F(
        "constant",
        "The learning rate after the warm-up, over the run's optimizer updates (TRL's and verl's "
        "lr_scheduler_type; sparserl.train.lr_schedule): constant | linear (to min_lr_ratio x lr at the last update) | "
        "cosine (likewise). A resume with another train.steps stretches it to the new length.",
    )
    min_lr_ratio: float = F(
        0.0,
        "The learning rate at the last update, as a fraction of train.lr, under linear and "
        "cosine (verl's min_lr_ratio).",
        ge=0,
        le=1,
    )
    max_nonfinite_steps: int = F(
        3,
        "A step whose loss or gradient norm is not finite is skipped, weights "
        "unchanged; this many such steps in a row stop the run with an error.",
        ge=1,
    )
    seed: int = F(0, "Seed of data order and sampling.")
    deterministic: bool = F(
        True,
        "On CUDA, torch's deterministic kernels and a fixed cuBLAS workspace, so that a "
        "rerun and a --resume give the same bits (as the CPU always does); false lets CUDA "
        "add in any order (faster backward scatter-adds, last bits vary run to run).",
    )
    lora_rank: int = F(
        0,
        "LoRA rank r: train peft LoRA adapters (W + alpha/r B A on the lora_target linears, the "
        "rest frozen); the sampler receives the merged weights at each push, checkpoints hold the "
        "adapter in peft's format. 0 = train all weights.",
        ge=0,
    )
    lora_alpha: int = F(16, "LoRA alpha (scale = alpha / rank).", gt=0)
    lora_dropout: float = F(0.0, "Dropout on the LoRA adapters' input.", ge=0, lt=1)
    lora_target: LoraTarget = F(
        "all-linear",
        "Linear modules that get adapters: all-linear (peft: every linear but "
        "the LM head) or a list of module names, e.g. [q_proj, k_proj, v_proj, o_proj].",
    )


class LogConfig(_Section):
    """Where and how a run records itself."""

    out_dir: NonEmpty = F("runs", "Folder that holds run folders.")
    run_name: Folder = F(None, "Run folder name; None = timestamp + config name.")
    tensorboard: bool = F(True, "Write TensorBoard scalars to <run>/tb/.")
    wandb: bool = F(False, "Log to Weights & Biases (if installed).")
    wandb_project: Str = F("sparserl", "W&B project name.")
    progress: Literal["auto", "rich", "plain", "none"] = F(
        "auto", "Progress display: auto (live when stdout is a terminal, else one line per step) | rich | plain | none."
    )


class CheckpointConfig(_Section):
    """Checkpoints of the learner and optimizer (to resume)."""

    every: int = F(10, "Save every N steps (0 = only at the end).", ge=0)
    keep_last: int = F(2, "Keep the N most recent checkpoints (0 = keep all).", ge=0)


class EvalConfig(_Section):
    """Periodic evaluation on data.eval."""

    every: int = F(0, "Evaluate every N steps (0 = only at the end, if data.eval is set).", ge=0)
    n: int = F(1, "Samples per evaluation prompt.", ge=1)
    temperature: float = F(0.0, "Evaluation temperature (0 = greedy).", ge=0)
    max_new_tokens: int | None = F(None, "Maximum response length; None = rollout.max_new_tokens.", ge=1)
    dense_only: bool = F(
        False,
        "Evaluate under dense inference only (Sparrow's val_dense_only): the sparse sampler's evaluation, which "
        "runs beside the dense one by default, is skipped (half the evaluation's time).",
    )
    compressor: Compressor | None = F(
        None, "KV compressor during evaluation; None = same as rollout (budget and trigger too), 'none' = dense."
    )


class MismatchConfig(_Section):
    """Sparrow's acceptance α between the sampler and the dense old policy (sparserl.mismatch.measure)."""

    alpha: Literal["exact", "topk", "off"] = F(
        "exact",
        "α per token: exact (whole vocabulary; q, the distribution the sampler drew from, as mismatch.alpha_q "
        "says: by default recomputed from the sampler's kept head inputs, no replay) | topk (Sparrow's "
        "approximation from the sampler's top-k log-probs: no replay, but on the default task it read 0.087 low "
        "per token and its p5 0.43 for 0.60: docs/results/alpha_topk_error.md) | off.",
    )
    alpha_bin: int = F(128, "Width in tokens of the sequence-length bins of mismatch/alpha_p5_bin/<start>.", ge=1)
    alpha_topk: int = F(20, "k of the topk mode (log-probs kept per sampled token).", ge=1)
    alpha_q: Literal["hidden", "kept", "replay"] = F(
        "hidden",
        "Where exact α's q comes from: hidden (the sampler keeps its LM head's input per sampled token, hidden-size "
        "values in its dtype, and q is recomputed from it by the sampler's own head, quantized or not, then the "
        "sampling's tempering and top-k / top-p, 256 positions at a time: no replay, no [N, T, V] tensor, also "
        "under rollout.async) | kept (the sampler keeps each step's whole distribution, within alpha_record_mib, "
        "else replay) | replay (the sampler re-run on its tokens: about one more rollout). DistillSparse always "
        "replays (it records what the sampler read).",
    )
    alpha_record_mib: int = F(
        1024,
        "exact α with mismatch.alpha_q=kept: the sampler keeps each step's whole distribution q while it samples "
        "when a step's q fit in this many MiB (responses x rollout.max_new_tokens x vocabulary x 4 bytes; the "
        "default job: 288 MiB), and α reads them instead of replaying the sampler (rollout workers send their "
        "shards' back); above it (or with DistillSparse, which replays what the sampler read) the sampler is "
        "replayed (under rollout.async: a config error). 0 = always replay. Unused by alpha_q=hidden and replay.",
        ge=0,
    )


class ClusterConfig(_Section):
    """Scaling out on Ray: rollout workers as Ray actors (sparserl.cluster), data-parallel learners
    (sparserl.train.data_parallel)."""

    rollout_workers: int | None = F(
        None,
        "Rollout workers, each a Ray actor holding the run's sampler; a step's "
        "prompts are split across them. None = the sampler runs in the training "
        "process (no Ray).",
        ge=1,
    )
    address: Str | None = F(
        None,
        "Ray to use: None = a local Ray started for the run and shut down after it; "
        "auto = the cluster this machine has joined (`ray start`); host:port = that head.",
    )
    worker_cpus: float = F(1.0, "Ray CPUs per rollout worker (also its torch threads).", gt=0)
    worker_gpus: float = F(0.0, "Ray GPUs per rollout worker (a fraction shares a GPU).", ge=0)
    learners: int = F(
        1,
        "Data-parallel learners: the training process and learners - 1 Ray actors in one "
        "torch.distributed group (gloo on CPU, NCCL on GPU); gradients summed, loss normalised over "
        "the whole batch.",
        ge=1,
    )
    learner_cpus: float = F(1.0, "Ray CPUs per learner actor (also its torch threads).", gt=0)
    learner_gpus: float = F(0.0, "Ray GPUs per learner actor.", ge=0)


SECTIONS: dict[str, type[_Section]] = {
    "model": ModelConfig,
    "rollout": RolloutConfig,
    "data": DataConfig,
    "reward": RewardConfig,
    "algorithm": AlgorithmConfig,
    "train": TrainConfig,
    "log": LogConfig,
    "checkpoint": CheckpointConfig,
    "eval": EvalConfig,
    "mismatch": MismatchConfig,
    "cluster": ClusterConfig,
}


#: ``train.max_tokens_per_micro_batch: auto``'s two budgets (:meth:`Config.auto_token_budget`): for a rollout batch
#: that fits one micro-batch whole, and for one packed by length.
AUTO_TOKEN_BUDGETS = (4096, 2048)


class Config(_Section):
    """The whole configuration of a run."""

    name: Str = F("default", "Config name (the preset or file stem unless set); used in run names.")
    model: ModelConfig = F(help="Model.", factory=ModelConfig)
    rollout: RolloutConfig = F(help="Sampler.", factory=RolloutConfig)
    data: DataConfig = F(help="Data.", factory=DataConfig)
    reward: RewardConfig = F(help="Reward.", factory=RewardConfig)
    algorithm: AlgorithmConfig = F(help="Algorithm.", factory=AlgorithmConfig)
    train: TrainConfig = F(help="Training loop and optimizer.", factory=TrainConfig)
    log: LogConfig = F(help="Logging.", factory=LogConfig)
    checkpoint: CheckpointConfig = F(help="Checkpoints.", factory=CheckpointConfig)
    eval: EvalConfig = F(help="Evaluation.", factory=EvalConfig)
    mismatch: MismatchConfig = F(help="Mismatch measurement (Sparrow's α).", factory=MismatchConfig)
    cluster: ClusterConfig = F(help="Scaling out on Ray.", factory=ClusterConfig)

    @model_validator(mode="after")
    def _resolve_token_budget(self) -> Config:
        """``train.max_tokens_per_micro_batch: auto`` becomes :meth:`auto_token_budget`'s number."""
        if self.train.max_tokens_per_micro_batch == "auto":
            self.train.max_tokens_per_micro_batch = self.auto_token_budget()
        return self

    def auto_token_budget(self) -> int:
        """``train.max_tokens_per_micro_batch: auto``: :data:`AUTO_TOKEN_BUDGETS`' larger budget when a whole
        rollout batch at its longest (:meth:`update_forward_tokens`) fits it, so the update's forward can be the
        old policy's; otherwise the smaller one, raised to one whole row (``rollout.max_new_tokens`` after a
        prompt of the rules' 512-token bound) where that is longer. Measured on SmolLM2-135M at 32 x 1,024 tokens
        (docs/results/memory_over_a_run): 2,048 peaks 2.2 GB below 4,096 over a run for 1.08x the update's
        compute; the main job (32 x 48) keeps its whole batch in one 4,096-token micro-batch."""
        from ..packing import PROMPT_TOKENS_BOUND

        whole_batch, long_rows = AUTO_TOKEN_BUDGETS
        if self.update_forward_tokens() <= whole_batch:
            return whole_batch
        return max(long_rows, self.rollout.max_new_tokens + PROMPT_TOKENS_BOUND)

    def to_dict(self) -> dict:
        """The config as plain nested dicts/lists/scalars (YAML- and JSON-ready)."""
        return self.model_dump(mode="json", by_alias=True)

    def update_shape(self) -> tuple[int, int, int]:
        """(samples per rollout batch, samples per optimizer step, micro-batches per optimizer step) of
        the update (``train.*``, ``rollout.n``)."""
        t = self.train
        batch = t.prompts_per_step * self.rollout.n
        mini = min(batch, (t.mini_batch_prompts or t.prompts_per_step) * self.rollout.n)
        return batch, mini, -(-mini // t.micro_batch_size)

    def why_update_forward_is_not_old_policy(
        self, dropout: float | None = None, prompt_tokens: int | None = None
    ) -> str | None:
        """Why ``algorithm.old_logprobs=update`` cannot hold for this config
        (:func:`sparserl.score.old_policy.why_update_forward_is_not_old_policy`), or None. ``dropout``: the
        learner's, measured on the model (:func:`~sparserl.score.old_policy.model_dropout`); None = what the
        config alone says (``train.lora_dropout`` when LoRA trains). ``prompt_tokens``: the data's longest
        prompt as preflight bounds it (:func:`sparserl.preflight.prompt_tokens_bound`); None = the rules' bound."""
        from ..score.old_policy import why_update_forward_is_not_old_policy

        if self.rollout.oversample:
            return "rollout.oversample keeps responses by their old-policy log-probs before the update"
        batch, mini, micro = self.update_shape()
        if dropout is None:
            dropout = self.train.lora_dropout if self.train.lora_rank else 0.0
        return why_update_forward_is_not_old_policy(
            optimizer_steps=self.train.ppo_epochs * -(-batch // mini),
            micro_batches=micro,
            learners=self.cluster.learners,
            dropout=dropout,
            tokens=self.update_forward_tokens(prompt_tokens),
            max_tokens=self.train.max_tokens_per_micro_batch,
        )

    def update_forward_tokens(self, prompt_tokens: int | None = None) -> int:
        """The tokens one forward over a whole rollout batch may compute: ``rollout.n`` responses of
        ``rollout.max_new_tokens`` to each of ``train.prompts_per_step`` prompts of at most ``prompt_tokens``
        (None: :data:`~sparserl.packing.PROMPT_TOKENS_BOUND`) tokens, each prompt once under ``train.shared_prompt``
        (unless gradient checkpointing, which runs every row whole, is on: :mod:`sparserl.packing`)."""
        from ..packing import PROMPT_TOKENS_BOUND, worst_case_tokens

        t = self.train
        shared = t.shared_prompt and t.gradient_checkpointing is not True
        batch = t.prompts_per_step * self.rollout.n
        prompt = PROMPT_TOKENS_BOUND if prompt_tokens is None else prompt_tokens
        return worst_case_tokens(batch, t.prompts_per_step, prompt, self.rollout.max_new_tokens, shared)


# --- looking fields up by key ---------------------------------------------------------------------
def strip_annotated(tp: Any) -> Any:
    """The type inside ``Annotated[...]`` layers."""
    while typing.get_origin(tp) is Annotated:
        tp = typing.get_args(tp)[0]
    return tp


def type_name(tp: Any) -> str:
    """A field type in words for messages and help: ``int | null``, ``list of str``."""
    tp = strip_annotated(tp)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Union:
        s = " | ".join(type_name(a) for a in args if a is not type(None))
        return s + " | null" if type(None) in args else s
    if origin is tuple:
        return "list of " + ", ".join(type_name(a) for a in args)
    if origin is list or tp is list:
        return f"list of {type_name(args[0])}" if args else "list"
    if origin is dict:
        return "mapping"
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return "mapping of keys to values"
    return "str" if origin is Literal else getattr(tp, "__name__", str(tp))


def fields_of(cls: type[BaseModel]) -> dict[str, Any]:
    """A section's fields by the key a config file uses (the alias of a field whose name is a Python
    keyword: ``rollout.async`` is ``RolloutConfig.async_``)."""
    return {f.alias or name: f for name, f in cls.model_fields.items()}


def field_at(loc: tuple) -> Any:
    """The FieldInfo at ``(section, key)``, ``(section, key, subkey)`` of a sub-section
    (``rollout.kv_controller.threshold``) or ``(top_key,)``; None if there is none."""
    if len(loc) > 1 and loc[0] in SECTIONS:
        info = fields_of(SECTIONS[loc[0]]).get(str(loc[1]))
        sub = subsection(info)
        if len(loc) > 2 and sub is not None:
            return fields_of(sub).get(str(loc[2]))
        return info
    return fields_of(Config).get(str(loc[0])) if loc else None


def subsection(info: Any) -> type[_Section] | None:
    """The section class a field holds (``Optional[KVControllerConfig]``), else None."""
    if info is None:
        return None
    for tp in (info.annotation, *typing.get_args(info.annotation)):
        if isinstance(tp, type) and issubclass(tp, _Section):
            return tp
    return None
