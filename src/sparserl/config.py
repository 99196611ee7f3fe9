"""Typed configuration: pydantic models with documented, range-checked fields, read from YAML.

Why pydantic v2 (not OmegaConf): each field's type, default, bounds and help text sit in one
``Field``; one ``ValidationError`` collects every problem of a file at once; and plain YAML plus
dotted overrides need no resolver/interpolation language.

One ``Config`` holds nine sections (``model``, ``rollout``, ``data``, ``reward``, ``algorithm``,
``train``, ``log``, ``checkpoint``, ``eval``); ``config_help()`` (``sparserl config --keys``) prints every
field's help text::

    cfg = load_config("default")                                # a preset in sparserl/configs/
    cfg = load_config("my_run.yaml", ["rollout.kv_budget=64", 'rollout.stop=["\\n\\n"]',
                                      "rollout.compressor_options.lam=0.1"])  # file + overrides
    validate(cfg)                                               # rules that tie fields together
    save_config(cfg, run_dir / "config.yaml")                   # the run records what it ran

A file may start with ``base: <preset name or path>``: the base is loaded first and the file's keys
merge over it (mappings key by key, anything else replaces). Values follow YAML with two YAML 1.2
fixes: ``1e-5`` is a float and only ``true``/``false`` are booleans (``yes``/``on`` stay strings).

Each value is checked as it is set (type, range, choice; compressor, correction and advantage
estimator names against their registries); ``validate`` adds the cross-field rules. All problems go
into one ``ConfigError`` (a ``SparserlError`` and a ``ValueError``), a line each naming the source
(the file, or ``override``), the dotted key, the bad value and what is valid (the closest name too).
"""
from __future__ import annotations

import math
import re
import typing
import warnings
from pathlib import Path
from typing import Annotated, Any, Callable, Iterable, Literal, Optional, Union

import torch
import yaml
from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError,
                      field_validator)

from .correct.presets import apply_corrections, resolve
from .errors import SparserlError
from .registry import did_you_mean
from .models.mixed_precision import learner_compute_dtype
from .rollout.dtype_auto import resolve_dtype
from .rollout.kv import available_compressors, compressor_from_fields
from .rollout.kv.blocktopk import PAGE_TOKENS, k_problems
from .rollout.kv.schedule import ScheduleError, load_schedule, parse_pairs
from .rollout.kv_quant import available_kv_quants
from .rollout.quant import available_quants, build_quant
from .rollout.quant.int8_group import GROUP as QUANT_GROUP
from .reward.weighted import spec_problem as reward_spec_problem
from .score.old_policy import old_logprobs_source, why_update_forward_is_not_old_policy
from .train.advantages import available_adv_ests, get_adv_est
from .presets import PRESET_DIR, list_presets

__all__ = ["ConfigError", "ModelConfig", "KVControllerConfig", "RolloutConfig", "DataConfig", "RewardConfig", "AlgorithmConfig",
           "TrainConfig", "LogConfig", "CheckpointConfig", "EvalConfig", "Config", "load_config",
           "apply_overrides", "validate", "config_to_dict", "save_config", "list_presets", "preset_path",
           "config_help", "config_yaml"]



class ConfigError(SparserlError, ValueError):
    """A configuration value is unknown, of the wrong type, or out of range."""


# --- field types and checks ----------------------------------------------------------------------
def _check(ok: Callable[[Any], Any], msg: str) -> AfterValidator:
    """A field check: ``msg`` names the problem when ``ok(value)`` is false."""
    def check(v: Any) -> Any:
        if not ok(v):
            raise ValueError(msg)
        return v
    return AfterValidator(check)


class _Registered:
    """Field check: the value is one of a registry's names (``names()``: the registry's one list)."""

    def __init__(self, kind: str, names: Callable[[], list[str]]):
        self.kind, self.names = kind, names

    def __call__(self, v: str) -> str:
        if v not in (valid := self.names()):
            raise ValueError(f"not a registered {self.kind}{did_you_mean(v, valid)}; "
                             f"registered: {', '.join(valid)}")
        return v


def _correction(v: Any) -> Any:
    if not v:
        raise ValueError("must not be empty (use 'none')")
    try:
        resolve(v)  # the error lists the presets, the methods and the closest name
    except TypeError as e:
        raise ValueError(str(e)) from e
    return v


# numbers given to a string field keep their text (run_name: 2024); mapping keys are strings
Str = Annotated[str, BeforeValidator(lambda v: str(v) if type(v) in (int, float) else v)]
NonEmpty = Annotated[Str, _check(bool, "must not be empty")]
Options = Annotated[dict[str, Any], BeforeValidator(lambda v: {str(k): x for k, x in v.items()}
                                                    if isinstance(v, dict) else v)]
Compressor = Annotated[str, AfterValidator(_Registered("compressor", available_compressors))]
Quant = Annotated[str, AfterValidator(_Registered("weight quantization", available_quants))]
KVQuant = Annotated[str, AfterValidator(_Registered("KV-cache quantization", available_kv_quants))]
AdvEstimator = Annotated[str, AfterValidator(_Registered("advantage estimator", available_adv_ests))]
Correction = Annotated[Union[Str, list], AfterValidator(_correction)]
Device = Annotated[str, _check(lambda v: v in ("auto", "cpu", "mps") or re.fullmatch(r"cuda(:\d+)?", v),
                               "is not auto, cpu, cuda or cuda:N")]
Folder = Annotated[Optional[Str], _check(lambda v: v is None or ("/" not in v and v not in ("", ".", "..")),
                                         "must be a plain folder name")]
Beta = Annotated[float, Field(ge=0, lt=1)]
Betas = Annotated[tuple[Beta, Beta], BeforeValidator(lambda v: tuple(v) if isinstance(v, list) else v)]
def _lora_target(v: Any) -> Any:
    if v == "all-linear" or (isinstance(v, list) and v and all(isinstance(x, str) and x for x in v)):
        return v
    raise ValueError("expected all-linear or a non-empty list of module names (e.g. [q_proj, v_proj])")


LoraTarget = Annotated[Any, AfterValidator(_lora_target)]


#: the largest finite float32: every number of the config reaches torch as float32
FLOAT32_MAX = float(torch.finfo(torch.float32).max)


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
            raise ValueError(f"{which}must lie within float32's finite range, ±{FLOAT32_MAX:.8g} (numbers "
                             "reach torch as float32)")
    return v


def F(default: Any = None, help: str = "", factory: Any = None, **bounds: Any) -> Any:  # noqa: A002
    """A field with its help text (``description``), bounds (ge/gt/le/lt) and default or factory."""
    if factory is not None:
        return Field(default_factory=factory, description=help, **bounds)
    return Field(default, description=help, **bounds)


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
            _fail(_messages(e, lambda _key: "assignment", {}, (sec,) if sec else ()))


# --- sections ------------------------------------------------------------------------------------
class ModelConfig(_Section):
    """Which policy to train, and in what precision."""

    name: NonEmpty = F("smollm2-135m", "Model: a built-in name ('smollm2-135m', the embedded default; 'tiny', "
                       "a small random model for tests), a local Hugging Face folder, or a .gguf file.")
    dtype: Literal["float32", "bfloat16"] = F(
        "float32", "Learner (trained weights) dtype: float32 | bfloat16. The dense scorer uses the same dtype.")
    mixed_precision: Literal["auto", "off", "bfloat16"] = F(
        "auto", "The learner's forwards and backward in bfloat16 under torch.autocast, its weights, gradients and "
        "AdamW state in float32 (TRL's bf16=True, verl's FSDP mixed precision): auto (bfloat16 where this "
        "machine runs it measurably faster, timed once and cached) | off | bfloat16. With model.dtype=float32 "
        "only. `sparserl bench learner` measures the whole step.")
    seed: int = F(0, "Seed of the random initialisation of a 'tiny' model (ignored for real models).")
    device: Device = F("auto", "Device: auto (cuda if available, else cpu) | cpu | cuda | cuda:N.")


def _schedule_pairs(v: Any) -> Any:
    """A schedule given inline is checked here (a file is read by ``validate``)."""
    if isinstance(v, list):
        try:
            parse_pairs(v, "kv_schedule")
        except ScheduleError as e:
            raise ValueError(str(e).removeprefix("kv_schedule")) from None
    return v


Schedule = Annotated[Optional[Union[Str, list]], AfterValidator(_schedule_pairs)]


class KVControllerConfig(_Section):
    """The online budget controller (sparserl.train.kv_controller): each length bin's KV budget is raised
    or lowered between training steps from the measured α tail (mismatch/alpha_p5_bin/<start>)."""

    threshold: float = F(0.86, "Sparrow's threshold on the 5th percentile of α per length bin: a bin below it gets "
                         "more KV (Sparrow: training stayed stable above ~0.86).", gt=0, le=1)
    margin: float = F(0.04, "Hysteresis: a bin's budget is lowered only while its α tail stays at or above "
                      "threshold + margin.", ge=0, lt=1)
    patience: int = F(2, "Steps in a row a bin's α tail must clear threshold + margin before its budget is lowered.",
                      ge=1)
    bin: Optional[int] = F(None, "Width in tokens of the sequence-length bins; None = mismatch.alpha_bin (the bins "
                           "α is measured on; another width is an error).", ge=1)
    min_budget: int = F(16, "Smallest budget a bin may get.", ge=1)
    max_budget: int = F(256, "Largest budget a bin may get (sizes the sampler's buffers).", ge=1)
    step: int = F(8, "Tokens a bin's budget moves by at one adjustment.", ge=1)


class RolloutConfig(_Section):
    """The sampler: how responses are generated and how its KV cache is compressed."""

    compressor: Compressor = F("rkv", "KV-cache compressor of the sampler, a registered name: none (dense) | "
                               "streaming | snapkv | rkv | h2o | ...")
    kv_budget: int = F(64, "KV budget B in tokens per sequence (per layer) kept by the compressor.", ge=1)
    trigger: Literal["step_length", "newline"] = F(
        "step_length", "When to compress: step_length (every `step_length` decode steps once the cache "
        "exceeds the budget) | newline (after a newline token).")
    step_length: int = F(32, "Decode steps between two compressions (R-KV / Sparse-RL: 128).", ge=1)
    window: int = F(8, "Observation window w: the last w tokens are always kept and their queries score "
                    "the others (R-KV: 8).", ge=0)
    compress_prompt: bool = F(False, "Also compress the prompt's KV (R-KV leaves it whole).")
    tail_slack: int = F(0, "Spare KV slots past kv_budget + step_length: a compression due when the rest of "
                        "the generation fits in them is skipped (it could not pay for its scoring). 0 = the "
                        "buffer is exactly kv_budget + step_length.", ge=0)
    compressor_options: Options = F(help="Method-specific options, passed to the compressor as keyword "
                                    "arguments: e.g. lam, kernel, threshold, per_head, sinks.", factory=dict)
    kv_schedule: Schedule = F(None, "Sparrow's sparsity schedule: the KV budget as a function of the sequence length "
                              "(prompt + tokens generated), [[length, budget], ...] with lengths increasing, or a JSON "
                              "file (such pairs, or `sparserl calibrate`'s output: the schedule of rollout.compressor). "
                              "Replaces kv_budget; the buffers hold the largest budget. None = the fixed kv_budget.")
    blocktopk_pages: Optional[int] = F(None, "Block top-k (rollout.compressor=blocktopk): pages of 16 tokens each decode "
                                       "step reads per layer and KV head, the first page and the last 2 among them "
                                       "(layers 0 and 1 read every page). Wins over kv_budget (tokens read = 16 x "
                                       "pages); None = kv_budget / 16, or with kv_schedule its budget / 16. At least 3.")
    kv_controller: Optional[KVControllerConfig] = F(None, "The online budget controller (threshold, margin, patience, "
                                                   "bin, min_budget, max_budget, step); it starts from kv_schedule, "
                                                   "else kv_budget in every bin. None = off.")
    n: int = F(8, "Samples (responses) per prompt; GRPO needs n >= 2.", ge=1)
    temperature: float = F(1.0, "Sampling temperature (0 = greedy).", ge=0)
    top_p: float = F(1.0, "Nucleus sampling: keep the smallest set of tokens with this mass (1 = off).",
                     gt=0, le=1)
    top_k: int = F(0, "Keep only the k most likely tokens (0 = off).", ge=0)
    max_new_tokens: int = F(96, "Maximum response length in tokens.", ge=1)
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = F(
        "bfloat16", "Sampler dtype: auto | float32 | bfloat16 | float16.")
    quant: Quant = F("none", "The sampler's weight quantization (the learner stays in full precision; "
                     "re-quantized at every weight push): none | int8 (W8A8, QuRL) | int8_group (W8A8 with "
                     "weight and activation scales per group of 64 inputs: more accurate) | int8_weight_only | fp8 "
                     "(E4M3, FP8-RL; emulated where the device has no FP8 matmul).")
    kv_quant: KVQuant = F("none", "How the sampler's KV cache stores K and V: none | int8 | fp8 (1 byte per "
                          "element plus a float32 scale per token and KV head).")
    quant_scale: float = F(1.0, "QuRL's invariant scaling s: before training, W X = (W/s)(s X) with s folded "
                           "into the RMSNorms before q/k/v and gate/up (learner and sampler alike; full-precision "
                           "function unchanged, checkpoints keep the original form). QuRL: 1.5.", gt=0)
    quant_smooth: float = F(0.0, "SmoothQuant's migration strength a (sampler only): per input channel s_j = "
                             "max|X_j|^a / max|W_j|^(1-a), X W^T = (X/s)(W s)^T, so activation outliers move into "
                             "the weights before W8A8; the activation maxima are calibrated on a fixed text at every "
                             "push. 0 = off (QuRL/FP8-RL as published); 0.5 = the paper's default. Needs "
                             "rollout.quant int8, int8_group or fp8.", ge=0, lt=1)
    quant_outliers: int = F(0, "Input channels of every quantized linear kept in float32 (LLM.int8's mixed-precision "
                            "decomposition, with the channels fixed per push as QUIK does): the k inputs of largest "
                            "max|X_j| on the calibration text (after SmoothQuant's division when that is on), "
                            "re-chosen at every push; the rest quantized with scales over them alone. 0 = off "
                            "(QuRL/FP8-RL as published). Needs rollout.quant int8, int8_group or fp8.", ge=0)
    quant_head: bool = F(False, "Quantize the sampler's LM head too, with rollout.quant (and its SmoothQuant factors "
                         "and outlier channels, calibrated on the final norm's output). The head is ~20% of a "
                         "quantized decode step of SmolLM2-135M in float32; plain per-token int8 on it costs "
                         "acceptance, with outlier channels little (docs/results/smoothquant.md). Off: the head "
                         "stays in rollout.dtype, as QuRL/FP8-RL keep it.")
    quant_group: int = F(QUANT_GROUP, "Inputs per scale of rollout.quant=int8_group, for the weights (per output "
                         "and group) and the activations (per token and group); a multiple of 4: smaller groups "
                         "follow outlier channels more closely, at a little more cost. Only with int8_group.", ge=4)
    mismatch_split: bool = F(False, "Also score the responses with the sampler's quantized weights on a dense "
                             "full-precision cache and log the mismatch's two parts: mismatch/k3_kl_weights "
                             "(quantization) and mismatch/k3_kl_cache (eviction, KV rounding). Needs rollout.quant; "
                             "costs one teacher-forced forward of the sampler per step.")
    async_: bool = Field(False, alias="async", description=(
        "One-step-asynchronous rollouts (verl's one-step-off): the rollout workers sample step k + 1 with the "
        "weights before step k's update while the learner updates on step k; the learner scores the old "
        "policy itself and the corrections treat the one step of lag like any other mismatch "
        "(mismatch/policy_lag_steps; k3 and α split into mismatch/k3_kl_lag and mismatch/k3_kl_cache, "
        "mismatch/alpha_lag_* and mismatch/alpha_cache_*). The step after a checkpoint samples with fresh "
        "weights, so that a resumed run is exact. Needs cluster.rollout_workers."))
    compile: bool = F(False, "torch.compile the sampler's decode step (inductor: C++ on CPU, Triton on CUDA; "
                      "the first step compiles, ~20 s per graph on 2 cores); measure with `sparserl bench "
                      "rollout --compile` before turning it on.")
    stop: list[NonEmpty] = F(help="Stop strings: generation of a response ends after any of them (EOS always "
                             "stops).", factory=list)

    @property
    def quantized(self) -> bool:
        """The sampler's weights or KV cache are quantized (it then never runs the old policy exactly)."""
        return self.quant != "none" or self.kv_quant != "none"


class DataConfig(_Section):
    """Prompts and labels for training and evaluation."""

    train: NonEmpty = F("arith", "Training set: a built-in task name ('arith', options as 'arith:digits=1,"
                        "terms=2'), a data set name, or a local .jsonl/.json/.parquet path.")
    eval: Optional[Str] = F(None, "Evaluation set (same forms as `train`); None = no evaluation.")
    prompt_key: Optional[NonEmpty] = F(None, "Column holding the prompt (None = guess: problem, question, prompt...).")
    label_key: Optional[NonEmpty] = F(None, "Column holding the reference answer (None = guess: answer, solution...).")
    eval_prompt_key: Optional[NonEmpty] = F(None, "Column holding the prompt in the evaluation set (None = data.prompt_key "
                                       "where the evaluation file has that column, else a built-in set's own or a "
                                       "guess).")
    eval_label_key: Optional[NonEmpty] = F(None, "Column holding the reference answer in the evaluation set (None = "
                                      "data.label_key where the evaluation file has that column, else a built-in "
                                      "set's own or a guess).")
    template: Optional[Str] = F(None, "Prompt template with {prompt} (None = the model's chat template when it "
                                "has one, else the task's default).")
    system_prompt: Optional[Str] = F(None, "System message prepended when a chat template is used.")
    skip_bad_rows: bool = F(False, "Skip rows without prompt or label instead of failing.")
    limit: Optional[int] = F(None, "Use only the first `limit` training rows (None = all).", ge=1)
    eval_limit: Optional[int] = F(64, "Use only the first `eval_limit` evaluation rows (None = all).", ge=1)


class OverlongBufferConfig(_Section):
    """DAPO's soft overlong punishment (sparserl.reward.overlong; verl's reward_model.overlong_buffer)."""

    len: int = Field(description="L_cache: the last this many tokens up to rollout.max_new_tokens are the buffer where "
                     "the length penalty falls linearly from 0 to -penalty_factor (DAPO: 4,096 of 20,480).", ge=1)
    penalty_factor: float = F(1.0, "The penalty at rollout.max_new_tokens, where a response is cut (DAPO: 1).", ge=0)


class RewardConfig(_Section):
    """The verifier."""

    fn: Union[NonEmpty, list[NonEmpty]] = F(
        "math", "Reward function: a built-in name ('math': 1 if the final / boxed answer equals the label, else 0) or "
        "'module:function' taking (response, label[, prompt]); prompt is the problem as the model was asked it (its "
        "last user message, after data.template). A list sums several, weighted by reward.weights (TRL's "
        "reward_funcs); the first is the verifier held-out pass@k reads.")
    weights: Optional[list[float]] = F(None, "One weight per reward of reward.fn: R = sum of w_k r_k (TRL's "
                                       "reward_weights); None = 1 each.")
    timeout_s: float = F(5.0, "Seconds allowed to verify one response (in a checker process) before "
                         "it scores 0 (at most a day: the checker's timer takes no more than ~1e9 s).",
                         gt=0, le=86400)
    overlong_buffer: Optional[OverlongBufferConfig] = F(
        None, "DAPO's soft overlong punishment, {len, penalty_factor}: a response longer than rollout.max_new_tokens - "
        "len tokens gets penalty_factor x (max_new_tokens - len - length) / len added to its reward, -penalty_factor "
        "at the limit (verl's reward_model.overlong_buffer, TRL's soft_overlong_punishment); logged as "
        "reward/part/overlong. None = off.")


class DistillSparseConfig(_Section):
    """DistillSparse (Sparrow, Zhou et al., 2026): LoRA weights φ on the sparse sampler only, trained after
    each update with θ frozen (sparserl.train.distill_sparse)."""

    rank: int = Field(description="LoRA rank of φ (Sparrow: must be set).", ge=1)
    lambda_: float = Field(0.001, alias="lambda", ge=0, description=(
        "λ of L = L_PPO^sparse + λ·KL(q_φ ‖ p): the weight of the k3 estimate of the sampler's KL to the "
        "dense policy (Sparrow: 0.001)."))
    lr: float = F(1e-4, "Learning rate of φ (AdamW, the learner's betas and eps).", gt=0)
    alpha: int = F(16, "LoRA alpha of φ (scale alpha / rank; Sparrow: 16).", gt=0)
    target: LoraTarget = F("all-linear", "Linear modules that get φ: all-linear or a list of module names.")


class AlgorithmConfig(_Section):
    """Advantages, policy loss and the correction of the sampler/dense mismatch."""

    adv_estimator: AdvEstimator = F("grpo", "Advantage estimator, a registered name: grpo ((R - mean) / std "
                                    "within the group) | dr_grpo (R - mean, no std) | rloo (leave-one-out).")
    scale_rewards: Literal["group", "batch", "none"] = F(
        "group", "Std used to scale advantages: group | batch | none.")
    loss_agg: Literal["seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm"] = F(
        "seq_mean_token_mean", "Loss aggregation: seq_mean_token_mean (mean over a response's tokens, then over "
        "responses) | token_mean (over all tokens) | seq_mean_token_sum_norm (token sum / max length, Dr. GRPO).")
    clip_eps: float = F(0.2, "PPO clip range epsilon: the ratio pi/p is clipped to [1-eps, 1+eps_high].", gt=0)
    clip_eps_high: Optional[float] = F(None, "Upper clip epsilon (DAPO 'clip higher'); None = clip_eps.", gt=0)
    importance_sampling_level: Literal["token", "sequence"] = F(
        "token", "The PPO ratio pi/p per token, or per response: sequence = GSPO (TRL's importance_sampling_level, "
        "verl's loss_mode=gspo), the response's length-normalised ratio on every token; GSPO clips at "
        "clip_eps=3e-4, clip_eps_high=4e-4.")
    kl_coef: float = F(0.0, "Coefficient of the KL penalty to the reference (initial) model; 0 = no reference "
                       "model is kept (Sparse-RL: 1e-4).", ge=0)
    kl_kind: Literal["k1", "k2", "k3", "low_var_kl"] = F(
        "low_var_kl", "KL estimator: k1 | k2 | k3 | low_var_kl (k3, clamped).")
    entropy_coef: float = F(0.0, "Coefficient of the entropy bonus (0 = off).", ge=0)
    filter_groups: bool = F(False, "DAPO's dynamic sampling (verl's filter_groups): sample further batches of "
                            "train.prompts_per_step prompts until that many groups have rewards that differ (a group "
                            "of equal rewards has advantage 0), at most max_gen_batches, and train on the first ones; "
                            "short of them, groups of equal rewards fill the step. Logs sampling/gen_batches.")
    max_gen_batches: int = F(4, "At most this many batches sampled in a step under filter_groups.", ge=1)
    mask_truncated: bool = F(False, "Leave responses cut at rollout.max_new_tokens (finish reason 'length') out of "
                             "the loss and the corrections, as TRL's mask_truncated_completions and DAPO's overlong "
                             "filtering; their rewards still count in their group's advantages "
                             "(response/clipped_frac logs how many).")
    correction: Correction = F("sparse_rl", "Mismatch correction: a preset or method name from sparserl.correct "
                               "(e.g. sparse_rl, naive, none, tis, mis, qurl), or a list of method names / "
                               "[name, {options}] pairs.")
    correction_options: Options = F(help="Options of the correction overriding the preset's defaults (e.g. "
                                    "token_low, token_high, veto, is_cap).", factory=dict)
    old_logprobs: Literal["auto", "score", "sampler", "update"] = F(
        "auto", "Where the old policy's log-probs come from: score (a no-grad forward of the learner before the "
        "update) | sampler (the sampler's own; only when it runs the old policy exactly: rollout.compressor=none, "
        "temperature > 0, top_p=1, top_k=0, float32 sampler and learner) | update (the update's own forward, "
        "detached, as TRL with num_iterations=1; only when the step is one optimizer step over one micro-batch: "
        "ppo_epochs=1, the whole batch per mini-batch and per micro-batch, one learner, no dropout) | auto "
        "(sampler when that holds, else update when that holds, else score).")

    distill_sparse: Optional[DistillSparseConfig] = F(
        None, "DistillSparse (Sparrow): {rank, lambda, lr}: LoRA weights φ on the sparse sampler only; after each "
        "update, θ frozen, φ minimises L_PPO^sparse + λ·k3 KL(q_φ ‖ p) through a replay of the sampler's "
        "attention; the learner and the dense scorer never see φ. Logs mismatch/alpha_p5 (with φ) and "
        "mismatch/alpha_p5_nophi. Needs a sparse sampler and mismatch.alpha=exact. None = off.")

    @property
    def clip_eps_upper(self) -> float:
        """The effective upper clip epsilon (clip_eps_high, or clip_eps when unset)."""
        return self.clip_eps if self.clip_eps_high is None else self.clip_eps_high


class TrainConfig(_Section):
    """The RL loop and the optimizer."""

    steps: int = F(20, "RL steps (one rollout batch each).", ge=1)
    prompts_per_step: int = F(8, "Prompts per rollout batch (each sampled rollout.n times).", ge=1)
    mini_batch_prompts: Optional[int] = F(None, "Prompts per optimizer update; None = all: one update per "
                                          "rollout batch (on-policy); smaller = several updates.", ge=1)
    ppo_epochs: int = F(1, "Passes over each rollout batch.", ge=1)
    micro_batch_size: int = F(8, "Sequences per forward/backward (gradient accumulation inside a mini-batch); "
                              "lower it to save memory.", ge=1)
    shared_prompt: bool = F(True, "Forward each distinct prompt of a micro-batch once and only the responses "
                            "after it (its K/V shared by the group's rows): the same log-probs and gradients "
                            "with fewer tokens through the model; false = every row whole.")
    lr: float = F(1e-5, "Learning rate (AdamW).", gt=0)
    weight_decay: float = F(0.0, "AdamW weight decay.", ge=0)
    betas: Betas = F((0.9, 0.98), "AdamW betas.")
    eps: float = F(1e-8, "AdamW epsilon.", gt=0)
    grad_clip: Optional[float] = F(1.0, "Clip the gradient's global norm to this (None or 0 = no clipping).", ge=0)
    warmup_steps: int = F(0, "Linear learning-rate warm-up over this many optimizer updates (not RL steps: a "
                          "step makes ppo_epochs x prompts_per_step / mini_batch_prompts); train.lr_scheduler after.",
                          ge=0)
    lr_scheduler: Literal["constant", "linear", "cosine"] = F(
        "constant", "The learning rate after the warm-up, over the run's optimizer updates (TRL's and verl's "
        "lr_scheduler_type; sparserl.train.lr_schedule): constant | linear (to min_lr_ratio x lr at the last update) | "
        "cosine (likewise). A resume with another train.steps stretches it to the new length.")
    min_lr_ratio: float = F(0.0, "The learning rate at the last update, as a fraction of train.lr, under linear and "
                            "cosine (verl's min_lr_ratio).", ge=0, le=1)
    max_nonfinite_steps: int = F(3, "A step whose loss or gradient norm is not finite is skipped, weights "
                                 "unchanged; this many such steps in a row stop the run with an error.", ge=1)
    seed: int = F(0, "Seed of data order and sampling.")
    deterministic: bool = F(True, "On CUDA, torch's deterministic kernels and a fixed cuBLAS workspace, so that a "
                            "rerun and a --resume give the same bits (as the CPU always does); false lets CUDA "
                            "add in any order (faster backward scatter-adds, last bits vary run to run).")
    lora_rank: int = F(0, "LoRA rank r: train peft LoRA adapters (W + alpha/r B A on the lora_target linears, the "
                       "rest frozen); the sampler receives the merged weights at each push, checkpoints hold the "
                       "adapter in peft's format. 0 = train all weights.", ge=0)
    lora_alpha: int = F(16, "LoRA alpha (scale = alpha / rank).", gt=0)
    lora_dropout: float = F(0.0, "Dropout on the LoRA adapters' input.", ge=0, lt=1)
    lora_target: LoraTarget = F("all-linear", "Linear modules that get adapters: all-linear (peft: every linear but "
                                "the LM head) or a list of module names, e.g. [q_proj, k_proj, v_proj, o_proj].")


class LogConfig(_Section):
    """Where and how a run records itself."""

    out_dir: NonEmpty = F("runs", "Folder that holds run folders.")
    run_name: Folder = F(None, "Run folder name; None = timestamp + config name.")
    tensorboard: bool = F(True, "Write TensorBoard scalars to <run>/tb/.")
    wandb: bool = F(False, "Log to Weights & Biases (if installed).")
    wandb_project: Str = F("sparserl", "W&B project name.")
    progress: Literal["auto", "rich", "plain", "none"] = F(
        "auto", "Progress display: auto (live when stdout is a terminal, else one line per step) | rich | "
        "plain | none.")


class CheckpointConfig(_Section):
    """Checkpoints of the learner and optimizer (to resume)."""

    every: int = F(10, "Save every N steps (0 = only at the end).", ge=0)
    keep_last: int = F(2, "Keep the N most recent checkpoints (0 = keep all).", ge=0)


class EvalConfig(_Section):
    """Periodic evaluation on data.eval."""

    every: int = F(0, "Evaluate every N steps (0 = only at the end, if data.eval is set).", ge=0)
    n: int = F(1, "Samples per evaluation prompt.", ge=1)
    temperature: float = F(0.0, "Evaluation temperature (0 = greedy).", ge=0)
    max_new_tokens: Optional[int] = F(None, "Maximum response length; None = rollout.max_new_tokens.", ge=1)
    compressor: Optional[Compressor] = F(None, "KV compressor during evaluation; None = same as rollout (budget "
                                         "and trigger too), 'none' = dense.")


class MismatchConfig(_Section):
    """Sparrow's acceptance α between the sampler and the dense old policy (sparserl.train.alpha)."""

    alpha: Literal["exact", "topk", "off"] = F(
        "exact", "α per token: exact (the sampler replayed on its tokens, whole vocabulary; about one more "
        "rollout) | topk (Sparrow's approximation from the sampler's top-k log-probs: no replay, but on the "
        "default task it read 0.087 low per token and its p5 0.43 for 0.60: docs/results/alpha_topk_error.md) | off.")
    alpha_bin: int = F(128, "Width in tokens of the sequence-length bins of mismatch/alpha_p5_bin/<start>.", ge=1)
    alpha_topk: int = F(20, "k of the topk mode (log-probs kept per sampled token).", ge=1)
    alpha_record_mib: int = F(
        1024, "exact α: the sampler keeps each step's whole distribution q while it samples when a step's q fit in "
        "this many MiB (responses x rollout.max_new_tokens x vocabulary x 4 bytes; the default job: 288 MiB), and α "
        "reads them instead of replaying the sampler (rollout workers send their shards' back); above it (or with "
        "DistillSparse, which replays what the sampler read) the sampler is replayed, which rollout.async cannot "
        "do. 0 = always replay.", ge=0)


class ClusterConfig(_Section):
    """Scaling out on Ray: rollout workers as Ray actors (sparserl.cluster), data-parallel learners
    (sparserl.train.data_parallel)."""

    rollout_workers: Optional[int] = F(None, "Rollout workers, each a Ray actor holding the run's sampler; a step's "
                                       "prompts are split across them. None = the sampler runs in the training "
                                       "process (no Ray).", ge=1)
    address: Optional[Str] = F(None, "Ray to use: None = a local Ray started for the run and shut down after it; "
                               "auto = the cluster this machine has joined (`ray start`); host:port = that head.")
    worker_cpus: float = F(1.0, "Ray CPUs per rollout worker (also its torch threads).", gt=0)
    worker_gpus: float = F(0.0, "Ray GPUs per rollout worker (a fraction shares a GPU).", ge=0)
    learners: int = F(1, "Data-parallel learners: the training process and learners - 1 Ray actors in one "
                      "torch.distributed group (gloo on CPU, NCCL on GPU); gradients summed, loss normalised over "
                      "the whole batch.", ge=1)
    learner_cpus: float = F(1.0, "Ray CPUs per learner actor (also its torch threads).", gt=0)
    learner_gpus: float = F(0.0, "Ray GPUs per learner actor.", ge=0)


SECTIONS: dict[str, type[_Section]] = {
    "model": ModelConfig, "rollout": RolloutConfig, "data": DataConfig, "reward": RewardConfig,
    "algorithm": AlgorithmConfig, "train": TrainConfig, "log": LogConfig, "checkpoint": CheckpointConfig,
    "eval": EvalConfig, "mismatch": MismatchConfig, "cluster": ClusterConfig}


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

    @classmethod
    def from_dict(cls, data: dict | None, source: str = "dict") -> "Config":
        """Build a Config from a nested mapping (missing keys keep their defaults); one ConfigError
        naming ``source`` lists every unknown key and bad value."""
        return _build(dict(data or {}), lambda _key: source)

    def to_dict(self) -> dict:
        """The config as plain nested dicts/lists/scalars (YAML- and JSON-ready)."""
        return config_to_dict(self)

    def override(self, overrides: Iterable[str]) -> "Config":
        """Apply dotted ``section.key=value`` overrides in place; returns self."""
        return apply_overrides(self, overrides)

    def update_shape(self) -> tuple[int, int, int]:
        """(samples per rollout batch, samples per optimizer step, micro-batches per optimizer step) of
        the update (``train.*``, ``rollout.n``)."""
        t = self.train
        batch = t.prompts_per_step * self.rollout.n
        mini = min(batch, (t.mini_batch_prompts or t.prompts_per_step) * self.rollout.n)
        return batch, mini, -(-mini // t.micro_batch_size)

    def why_update_forward_is_not_old_policy(self, dropout: float | None = None) -> str | None:
        """Why ``algorithm.old_logprobs=update`` cannot hold for this config
        (:func:`sparserl.score.old_policy.why_update_forward_is_not_old_policy`), or None. ``dropout``: the
        learner's, measured on the model (:func:`~sparserl.score.old_policy.model_dropout`); None = what the
        config alone says (``train.lora_dropout`` when LoRA trains)."""
        batch, mini, micro = self.update_shape()
        if dropout is None:
            dropout = self.train.lora_dropout if self.train.lora_rank else 0.0
        return why_update_forward_is_not_old_policy(optimizer_steps=self.train.ppo_epochs * -(-batch // mini),
                                                    micro_batches=micro, learners=self.cluster.learners,
                                                    dropout=dropout)


# --- errors: pydantic's ValidationError -> one line per problem ----------------------------------
_BOUNDS = {"greater_than": ("gt", ">"), "greater_than_equal": ("ge", ">="), "less_than": ("lt", "<"),
           "less_than_equal": ("le", "<=")}


def _strip(tp: Any) -> Any:
    while typing.get_origin(tp) is Annotated:
        tp = typing.get_args(tp)[0]
    return tp


def _type_name(tp: Any) -> str:
    tp = _strip(tp)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Union:
        s = " | ".join(_type_name(a) for a in args if a is not type(None))
        return s + " | null" if type(None) in args else s
    if origin is tuple:
        return "list of " + ", ".join(_type_name(a) for a in args)
    if origin is list or tp is list:
        return f"list of {_type_name(args[0])}" if args else "list"
    if origin is dict:
        return "mapping"
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return "mapping of keys to values"
    return "str" if origin is Literal else getattr(tp, "__name__", str(tp))


def fields_of(cls: type[BaseModel]) -> dict[str, Any]:
    """A section's fields by the key a config file uses (the alias of a field whose name is a Python
    keyword: ``rollout.async`` is ``RolloutConfig.async_``)."""
    return {f.alias or name: f for name, f in cls.model_fields.items()}


def _field(loc: tuple) -> Any:
    """The FieldInfo at ``(section, key)``, ``(section, key, subkey)`` of a sub-section
    (``rollout.kv_controller.threshold``) or ``(top_key,)``; None if there is none."""
    if len(loc) > 1 and loc[0] in SECTIONS:
        info = fields_of(SECTIONS[loc[0]]).get(str(loc[1]))
        sub = _subsection(info)
        if len(loc) > 2 and sub is not None:
            return fields_of(sub).get(str(loc[2]))
        return info
    return fields_of(Config).get(str(loc[0])) if loc else None


def _subsection(info: Any) -> type[_Section] | None:
    """The section class a field holds (``Optional[KVControllerConfig]``), else None."""
    if info is None:
        return None
    for tp in (info.annotation, *typing.get_args(info.annotation)):
        if isinstance(tp, type) and issubclass(tp, _Section):
            return tp
    return None


def _messages(err: ValidationError, source_of: Callable[[str], str], data: dict, prefix: tuple = ()) -> list[str]:
    """One line per problem: ``<source>: <key>=<value>: <what is valid>``."""
    out: list[str] = []
    for e in err.errors():
        loc = (*prefix, *e["loc"])
        n = 2 if len(loc) > 1 and loc[0] in SECTIONS else 1
        if n == 2 and len(loc) > 2 and isinstance(loc[2], str) and _subsection(_field(loc[:2])) is not None:
            n = 3  # a sub-section's key: rollout.kv_controller.threshold
        key = ".".join(map(str, loc[:n]))
        full = key + "".join(f"[{p}]" for p in loc[n:] if isinstance(p, int))
        src, kind, value, info = source_of(key), e["type"], e["input"], _field(loc[:n])
        if kind == "extra_forbidden":
            sec = ".".join(map(str, loc[: n - 1])) if n >= 2 else None
            valid = list(fields_of(_subsection(_field(loc[:2])) if n == 3 else SECTIONS[sec] if sec else Config))
            hint = did_you_mean(loc[n - 1], valid)
            hint = hint.replace("'", f"'{sec}.", 1) if hint and sec else hint  # the dotted key
            out.append(f"{src}: unknown {'key' if sec else 'section'} '{key}'"
                       + (hint or f"; valid: {', '.join(valid)}"))
        elif kind in _BOUNDS:
            bound = e["ctx"][_BOUNDS[kind][0]]
            bound = int(bound) if isinstance(bound, float) and bound.is_integer() else bound
            out.append(f"{src}: {full}={value!r}: must be {_BOUNDS[kind][1]} {bound}")
        elif kind == "literal_error":
            valid = [str(a) for a in typing.get_args(_strip(info.annotation))]
            out.append(f"{src}: {full}={value!r}: not one of {', '.join(valid)}{did_you_mean(value, valid)}")
        elif kind == "missing":
            out.append(f"{src}: {full} is required ({info.description if info else 'no default'})")
        elif kind in ("value_error", "assertion_error"):
            out.append(f"{src}: {full}={value!r}: {e['ctx']['error']}")
        else:  # a type error: the field's whole value against the field's type
            got = data
            for p in loc[:n]:
                got = got.get(p, value) if isinstance(got, dict) else value
            line = (f"{src}: '{key}' expects {_type_name(info.annotation) if info else 'a mapping'}, "
                    f"got {type(got).__name__} {got!r}")
            out += [line] if line not in out else []
    return out


def _fail(errors: list[str]) -> typing.NoReturn:
    if len(errors) == 1:
        raise ConfigError(errors[0])
    raise ConfigError(f"{len(errors)} problems in the config:\n  - " + "\n  - ".join(errors))


def _build(data: dict, source_of: Callable[[str], str], errors: Iterable[str] = ()) -> Config:
    """The Config from a nested dict (no ``base``; an empty section is left out), or one ConfigError."""
    errors = list(errors)
    data = {k: v for k, v in data.items() if k != "base" and not (v is None and k in SECTIONS)}
    try:
        cfg = Config.model_validate(data)
    except ValidationError as e:
        errors += _messages(e, source_of, data)
    if errors:
        _fail(errors)
    return cfg


# --- YAML with YAML-1.2 floats and booleans ------------------------------------------------------
class _Loader(yaml.SafeLoader):
    """SafeLoader where ``1e-5`` is a float and only true/false are booleans."""


_Loader.yaml_implicit_resolvers = {
    ch: [(tag, rx) for tag, rx in rs if tag not in ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:float")]
    for ch, rs in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?
                   |[-+]?\.(?:inf|Inf|INF)
                   |\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."))


def _yaml_load(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass


# --- loading: presets, files with `base:`, overrides ---------------------------------------------
def preset_path(name: str) -> Path:
    """Path of the preset ``name`` (with or without ``.yaml``); ConfigError if there is none."""
    stem = name.removesuffix(".yaml")
    if (p := PRESET_DIR / f"{stem}.yaml").is_file():
        return p
    presets = list_presets()
    raise ConfigError(f"no config file or preset named '{name}'{did_you_mean(stem, presets)}; "
                      f"presets: {', '.join(presets)}")


def _find(path_or_name: str | Path, relative_to: Path | None = None) -> Path:
    p = Path(path_or_name).expanduser()
    for c in [p] if p.is_absolute() else ([relative_to / p] if relative_to else []) + [p]:
        if c.is_file():
            return c.resolve()
    return preset_path(str(path_or_name))


def _merge(base: dict, over: dict) -> dict:
    """Deep merge: mappings merge key by key, anything else in ``over`` replaces."""
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _load_raw(path: Path, seen: tuple[Path, ...] = ()) -> dict:
    if path in seen:
        raise ConfigError(f"{path}: circular 'base' chain: {' -> '.join(map(str, (*seen, path)))}")
    try:
        data = _yaml_load(path.read_bytes().decode("utf-8"))
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from e
    except UnicodeDecodeError as e:
        line = e.object[:e.start].count(b"\n") + 1
        raise ConfigError(f"{path} line {line}: not UTF-8 text (byte 0x{e.object[e.start]:02x}); a config is "
                          "a YAML file") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read ({e.strerror or e})") from None
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections, got {type(data).__name__}")
    if (base := data.pop("base", None)) is not None:
        if not isinstance(base, str):
            raise ConfigError(f"{path}: 'base' expects a preset name or a path, got {base!r}")
        base_raw = _load_raw(_find(base, path.parent), (*seen, path))
        base_raw.pop("name", None)  # the name is the leaf file's
        data = _merge(base_raw, data)
    return data


def _takes_str(ann: Any) -> bool:
    return ann is str or (typing.get_origin(ann) is Union and str in map(_strip, typing.get_args(ann)))


def _apply_override(data: dict, item: str) -> str:
    """Set one ``a.b.c=value`` in the nested dict ``data``; returns the dotted key of the field."""
    if "=" not in item:
        raise ConfigError(f"override: '{item}' is not of the form section.key=value")
    key, text = item.split("=", 1)
    parts = (key := key.strip().removeprefix("--")).split(".")
    if not all(parts):
        raise ConfigError(f"override: '{item}' has an empty key")
    try:
        value = _yaml_load(text) if text.strip() else None
    except yaml.YAMLError:
        value = text  # e.g. "a: b: c" is not YAML: keep the text
    n = 2 if len(parts) > 1 and parts[0] in SECTIONS else 1
    info = _field(tuple(parts[:n]))
    if len(parts) > n and _subsection(info) is not None:  # a sub-section's key: rollout.kv_controller.threshold
        n += 1
        info = _field(tuple(parts[:n]))  # None for an unknown key: validation names it, with a hint
    ann = _strip(info.annotation) if info else None
    if len(parts) == 1 and key in SECTIONS:  # section={...} merges into the section
        if not isinstance(value, dict):
            raise ConfigError(f"override: '{key}' is a section; set one key as '{key}.key=value'")
        value = {**(data.get(key) or {}), **{str(k): v for k, v in value.items()}}
    elif len(parts) > n and info is not None and typing.get_origin(ann) is not dict:
        raise ConfigError(f"override: '{'.'.join(parts[:n])}' is not a mapping; cannot set '{key}'")
    elif len(parts) == n and type(value) in (bool, int, float) and _takes_str(ann):
        value = text.strip()  # a string field given what YAML reads as a number (run_name=007): the text
    node = data
    for p in parts[:-1]:
        node[p] = node = dict(node[p]) if isinstance(node.get(p), dict) else {}
    node[parts[-1]] = value
    return ".".join(parts[:n])


def _with_overrides(data: dict, overrides: Iterable[str], source: str | None) -> Config:
    """Apply overrides to a nested dict and build the Config: every problem in one ConfigError."""
    touched, errors = set(), []
    in_file = {f"{name}.{key}" for name, section in data.items() if isinstance(section, dict)
               for key, value in section.items() if isinstance(value, dict)}  # the file's sub-sections
    for item in [overrides] if isinstance(overrides, str) else overrides:
        try:
            touched.add(_apply_override(data, item))
        except ConfigError as e:
            errors.append(str(e))

    def source_of(key: str) -> str:  # an override of the key or of a section holding it, or of a
        parts = key.split(".")      # sub-section key when the file has no such sub-section
        overridden = any(".".join(parts[:i]) in touched for i in range(1, len(parts) + 1))
        sub = ".".join(parts[:2])
        created = len(parts) == 3 and sub not in in_file and any(t.startswith(sub + ".") for t in touched)
        return "override" if source is None or overridden or created else source

    return _build(data, source_of, errors)


def load_config(path_or_name: str | Path | None = None, overrides: Iterable[str] = ()) -> Config:
    """Load a config from a YAML file or a preset name, then apply dotted overrides.

    ``path_or_name``: a path to a YAML file, a preset name (``default``, ``sparse_rl_math``,
    ``dense``, ``sparse_naive``; see ``list_presets()``), or None for ``default``.
    ``overrides``: strings ``section.key=value`` (value read with YAML rules), e.g.
    ``rollout.kv_budget=64``, ``algorithm.clip_eps_high=null``, ``rollout.compressor_options.lam=0.1``.

    One ConfigError lists every bad value of the file and the overrides; the cross-field rules are
    ``validate``'s, which the caller runs once every override is in.
    """
    path = _find(path_or_name if path_or_name is not None else "default")
    raw = _load_raw(path)
    raw.setdefault("name", path.stem)
    return _with_overrides(raw, overrides, str(path))


def apply_overrides(cfg: Config, overrides: Iterable[str]) -> Config:
    """Apply ``section.key=value`` strings to ``cfg`` in place (and return it).

    A key under a mapping field (``rollout.compressor_options.lam=0.1``) sets that entry;
    ``section={...}`` merges a mapping into a section; ``name=...`` renames the config.
    """
    cfg.__dict__.update(_with_overrides(config_to_dict(cfg), overrides, None).__dict__)
    return cfg


# --- saving --------------------------------------------------------------------------------------
def config_to_dict(cfg: Config) -> dict:
    """The config as nested plain dicts (tuples become lists): ``Config.from_dict`` reads it back."""
    return cfg.model_dump(mode="json", by_alias=True)


def config_yaml(cfg: Config, notes: list[str] | tuple = (), title: str = "written by save_config") -> str:
    """The full resolved config as YAML text (``load_config`` reads it back unchanged); ``notes`` become
    comment lines at its top."""
    text = yaml.safe_dump(config_to_dict(cfg), sort_keys=False, default_flow_style=None, allow_unicode=True,
                          width=100)
    header = "".join(f"# {line}\n" for note in notes for line in str(note).splitlines())
    return f"# Full resolved sparserl config ({title}).\n" + header + text


def save_config(cfg: Config, path: str | Path, notes: list[str] | tuple = ()) -> Path:
    """Write :func:`config_yaml` to ``path``; ``notes``: what ``auto`` values resolved to on this machine,
    and why."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(config_yaml(cfg, notes))
    return path


# --- cross-field rules ---------------------------------------------------------------------------
def validate(cfg: Config) -> Config:
    """Check the rules that tie fields together, before anything heavy loads (each field's own type,
    range and name were checked as it was set). One ConfigError lists every problem; returns ``cfg``.
    """
    r, a, t = cfg.rollout, cfg.algorithm, cfg.train
    errors: list[str] = []
    if (first_step := t.lr / (1 - t.betas[0])) > FLOAT32_MAX:  # AdamW's bias-corrected step size, in float32
        errors.append(f"train.lr={t.lr!r}: AdamW's first step size, lr / (1 - train.betas[0]) = {first_step:.4g}, "
                      f"overflows float32 (at most {FLOAT32_MAX:.8g}); lower train.lr")
    if cfg.model.mixed_precision == "bfloat16" and cfg.model.dtype != "float32":
        errors.append(f"model.mixed_precision={cfg.model.mixed_precision} keeps float32 weights and computes in 16 "
                      f"bits; with model.dtype={cfg.model.dtype} the weights are 16-bit already: set model.dtype="
                      "float32, or model.mixed_precision=off")
    if r.compressor not in ("none", "blocktopk") and r.kv_budget <= r.window and r.kv_schedule is None:
        errors.append(f"rollout.kv_budget={r.kv_budget} must be larger than rollout.window={r.window} "
                      "(the window's tokens are always kept)")
    if isinstance(r.kv_schedule, str):
        try:
            load_schedule(r.kv_schedule, r.compressor)
        except ScheduleError as e:
            errors.append(str(e) if str(e).startswith("rollout.kv_schedule") else f"rollout.kv_schedule: {e}")
    if r.blocktopk_pages is not None and r.compressor != "blocktopk":
        errors.append(f"rollout.blocktopk_pages={r.blocktopk_pages} is an option of rollout.compressor=blocktopk, not "
                      f"{r.compressor!r}; leave it out (null) or set rollout.compressor=blocktopk")
    if r.compressor == "blocktopk":  # k in whole pages, at least the 3 always read (rollout/kv/blocktopk.py)
        try:
            budgets = None if r.kv_schedule is None else list(load_schedule(r.kv_schedule, r.compressor).budgets)
        except ScheduleError:
            budgets = None  # reported above
        errors += k_problems(r.kv_budget if budgets is None else None, r.blocktopk_pages, budgets,
                             budget_key="rollout.kv_budget", pages_key="rollout.blocktopk_pages",
                             schedule_key="rollout.kv_schedule")
        if r.compile:
            errors.append("rollout.compile=true with rollout.compressor=blocktopk: the compiled decode step reads the "
                          "whole cache and cannot choose pages per step; set rollout.compile=false")
        if (kc := r.kv_controller) is not None:
            if r.blocktopk_pages is not None:
                errors.append(f"rollout.blocktopk_pages={r.blocktopk_pages} and rollout.kv_controller both decide "
                              "the pages block top-k reads; give one")
            bad = [f"{key}={v}" for key, v in (("min_budget", kc.min_budget), ("max_budget", kc.max_budget),
                                               ("step", kc.step)) if v % PAGE_TOKENS]
            if bad or kc.min_budget < 3 * PAGE_TOKENS:
                errors.append(f"rollout.kv_controller ({', '.join(bad) or f'min_budget={kc.min_budget}'}): with "
                              f"rollout.compressor=blocktopk the budgets move in whole pages: min_budget, max_budget "
                              f"and step multiples of {PAGE_TOKENS}, min_budget >= {3 * PAGE_TOKENS} (3 pages)")
    if (kc := r.kv_controller) is not None:
        if r.compressor == "none":
            errors.append("rollout.kv_controller needs a compressor (rollout.compressor='none' keeps every token)")
        if cfg.mismatch.alpha == "off":
            errors.append("rollout.kv_controller steers by the measured α tail: set mismatch.alpha to exact or topk")
        if kc.bin is not None and kc.bin != cfg.mismatch.alpha_bin:
            errors.append(f"rollout.kv_controller.bin={kc.bin} must equal mismatch.alpha_bin="
                          f"{cfg.mismatch.alpha_bin} (the bins α is measured on), or be left out")
        if kc.min_budget > kc.max_budget:
            errors.append(f"rollout.kv_controller.min_budget={kc.min_budget} is above max_budget={kc.max_budget}")
        if r.compressor not in ("none", "blocktopk") and kc.min_budget <= r.window:
            errors.append(f"rollout.kv_controller.min_budget={kc.min_budget} must be larger than rollout.window="
                          f"{r.window} (the window's tokens are always kept)")
    c = cfg.cluster
    if (ob := cfg.reward.overlong_buffer) is not None and ob.len > r.max_new_tokens:
        errors.append(f"reward.overlong_buffer.len={ob.len} is more than rollout.max_new_tokens={r.max_new_tokens}: "
                      "the buffer is the last len tokens before the limit")
    if c.rollout_workers is None and c.learners == 1 and c.address is not None:
        errors.append(f"cluster.address={c.address!r} needs cluster.rollout_workers or cluster.learners > 1 (without "
                      "them everything runs in the training process)")
    if c.learners > 1:
        samples, mini, micro = cfg.update_shape()
        if c.learners > samples:
            errors.append(f"cluster.learners={c.learners} is more than the {samples} samples per step "
                          f"(train.prompts_per_step={t.prompts_per_step} x rollout.n={r.n})")
        elif c.learners > micro:
            errors.append(f"cluster.learners={c.learners} is more than the {micro} micro-batch{'es' if micro != 1 else ''} of an optimizer step "
                          f"({mini} samples / train.micro_batch_size={t.micro_batch_size}): a learner would get none; "
                          "lower train.micro_batch_size")
    if t.lora_rank and r.quant_scale != 1.0:
        errors.append(f"train.lora_rank={t.lora_rank} with rollout.quant_scale={r.quant_scale}: QuRL's invariant scaling "
                      "folds s into the frozen base weights, which LoRA does not train; use one or the other")
    if a.distill_sparse is not None:  # φ is trained through a replay of what the sparse sampler attended
        if r.compressor == "none":
            errors.append("algorithm.distill_sparse needs a sparse sampler: with rollout.compressor=none the sampler is "
                          "the dense policy and φ has nothing to distill; set rollout.compressor (e.g. rkv) and "
                          "rollout.kv_budget, or leave distill_sparse out")
        if r.quantized or r.quant_scale != 1.0:
            errors.append(f"algorithm.distill_sparse with rollout.quant={r.quant!r}, kv_quant={r.kv_quant!r}, "
                          f"quant_scale={r.quant_scale}: its replay reproduces which tokens the sampler attended, "
                          "not the rounding of quantized weights or KV; use a full-precision sparse sampler")
        if r.dtype in ("bfloat16", "float16"):
            errors.append(f"algorithm.distill_sparse with rollout.dtype={r.dtype}: its replay runs in float32 and "
                          "reproduces which tokens the sampler attended, not a half-precision step's rounding; use "
                          "rollout.dtype=float32 or auto (float32 with distill_sparse)")
        if cfg.mismatch.alpha != "exact":
            errors.append(f"algorithm.distill_sparse with mismatch.alpha={cfg.mismatch.alpha!r}: it records what the "
                          "sampler attended during the exact α's replay and logs mismatch/alpha_p5_nophi from it; "
                          "set mismatch.alpha=exact")
        if r.top_p < 1.0 or r.top_k > 0 or r.temperature <= 0:
            errors.append(f"algorithm.distill_sparse with rollout.temperature={r.temperature}, top_p={r.top_p}, "
                          f"top_k={r.top_k}: φ's loss uses the sampler's full tempered distribution; use temperature "
                          "> 0, top_p=1 and top_k=0")
    if r.async_:
        if c.rollout_workers is None:
            errors.append("rollout.async=true needs cluster.rollout_workers (the workers sample the next step while "
                          "the training process updates on this one)")
        if cfg.mismatch.alpha == "exact" and cfg.mismatch.alpha_record_mib == 0:
            errors.append("rollout.async=true with mismatch.alpha=exact and mismatch.alpha_record_mib=0: under "
                          "rollout.async the exact α reads the q the workers keep while they sample (the training "
                          "process's sampler is a step newer than the rollout's and cannot replay it); leave "
                          "mismatch.alpha_record_mib at its default, or use mismatch.alpha=topk (α with its lag and "
                          "cache parts) or off")
        if r.mismatch_split:
            errors.append("rollout.async=true with rollout.mismatch_split=true: the asynchronous split "
                          "(mismatch/k3_kl_lag, mismatch/k3_kl_cache, read on the workers) replaces it; leave "
                          "mismatch_split out")
    if c.rollout_workers is not None and c.rollout_workers > t.prompts_per_step:
        errors.append(f"cluster.rollout_workers={c.rollout_workers} is more than train.prompts_per_step="
                      f"{t.prompts_per_step}: a worker would get no prompt")
    if getattr(get_adv_est(a.adv_estimator), "needs_group", True) and r.n < 2:
        errors.append(f"rollout.n={r.n}: algorithm.adv_estimator={a.adv_estimator!r} compares the samples "
                      "of a prompt with each other and needs rollout.n >= 2")
    if t.mini_batch_prompts is not None and t.prompts_per_step % t.mini_batch_prompts:
        errors.append(f"train.prompts_per_step={t.prompts_per_step} must be divisible by "
                      f"train.mini_batch_prompts={t.mini_batch_prompts}")
    if isinstance(a.correction, list) and a.correction_options:
        errors.append("algorithm.correction_options apply to a single named correction; with a list, give "
                      "options per method as [name, {options}]")
    else:
        try:
            resolve(a.correction, dict(a.correction_options))
            # run it once on a one-token batch (cheap, no model): bad option *values* fail now too
            one = torch.zeros(1, 1)
            apply_corrections(a.correction, one, one, torch.ones(1, 1), dict(a.correction_options) or None)
        except (ValueError, TypeError) as e:
            errors.append(f"algorithm.correction={a.correction!r} (algorithm.correction_options="
                          f"{dict(a.correction_options)}): {e}")
    if not errors:  # build it once with the one builder (cheap, no model): bad options fail now
        try:
            compressor = compressor_from_fields(r)
        except (TypeError, ValueError) as e:
            errors.append(f"rollout.compressor={r.compressor!r} with rollout.compressor_options="
                          f"{dict(r.compressor_options)}: {e} (options are method-specific; clear them with "
                          "rollout.compressor_options={})")
        else:
            try:
                old_logprobs_source(a.old_logprobs, why_not_update=cfg.why_update_forward_is_not_old_policy(),
                                    compresses=compressor.compresses, sampler_dtype=resolve_dtype(r.dtype, cfg.model.device),
                                    learner_dtype=learner_compute_dtype(cfg.model), temperature=r.temperature,
                                    top_p=r.top_p, top_k=r.top_k, quantized=r.quantized, lagged=r.async_)
            except SparserlError as e:
                errors.append(str(e))
    if r.quant_smooth and not build_quant(r.quant).quantizes_activations:
        errors.append(f"rollout.quant_smooth={r.quant_smooth} needs rollout.quant int8, int8_group or fp8 "
                      f"(SmoothQuant moves activation outliers into the weights; rollout.quant={r.quant!r} "
                      f"quantizes no activations)")
    if r.quant_outliers and not build_quant(r.quant).quantizes_activations:
        errors.append(f"rollout.quant_outliers={r.quant_outliers} needs rollout.quant int8, int8_group or fp8 "
                      f"(it keeps activation outlier channels out of the quantized product; rollout.quant="
                      f"{r.quant!r} quantizes no activations)")
    if r.quant_head and not build_quant(r.quant).quantizes:
        errors.append(f"rollout.quant_head=true needs a weight quantization (rollout.quant int8, int8_group, fp8, "
                      f"...; rollout.quant={r.quant!r})")
    if r.quant_group % 4:
        errors.append(f"rollout.quant_group={r.quant_group} must be a multiple of 4 (the int8 kernel's 4-byte steps)")
    if r.quant_group != QUANT_GROUP and not build_quant(r.quant).takes_group:
        errors.append(f"rollout.quant_group={r.quant_group} applies to rollout.quant=int8_group only "
                      f"(rollout.quant={r.quant!r} has no activation groups)")
    if a.filter_groups and r.async_:
        errors.append("algorithm.filter_groups=true with rollout.async=true: dynamic sampling decides from a step's "
                      "rewards whether to sample more, which the one-step-ahead rollout has already sent")
    if a.filter_groups and r.n < 2:
        errors.append(f"algorithm.filter_groups=true with rollout.n={r.n}: a group of one response never has rewards "
                      "that differ; set rollout.n >= 2")
    if (problem := reward_spec_problem(cfg.reward.fn, cfg.reward.weights)) is not None:
        errors.append(problem)
    if r.mismatch_split and r.quant == "none":
        errors.append("rollout.mismatch_split=true needs rollout.quant (int8, fp8, ...): with full-precision "
                      "weights the whole mismatch is the cache's")
    if errors:
        raise ConfigError(f"invalid config '{cfg.name}':\n  - " + "\n  - ".join(errors))
    if r.temperature == 0 and r.n > 1:
        warnings.warn("rollout.temperature=0 (greedy): the n samples of a prompt are identical and group "
                      "advantages are all zero", stacklevel=2)
    return cfg


# --- help ----------------------------------------------------------------------------------------
def config_help(match: str | None = None) -> str:
    """Every field as ``section.key (type, default): help``, one per line, grouped by section, with the
    keys of a sub-section (``rollout.kv_controller.threshold``) after the field that holds it; a field
    checked against a registry also lists the registry's names. ``match``: only the lines whose text
    holds it (case-insensitive), under their section's line."""
    lines, defaults = [], config_to_dict(Config())

    def line(key: str, f: Any, default: Any, indent: str) -> str:
        if f.is_required():
            dflt = "required"
        else:
            dflt = yaml.safe_dump(default, default_flow_style=True).strip().removesuffix("...").strip()
        names = [m.func.names() for m in f.metadata if isinstance(getattr(m, "func", None), _Registered)]
        extra = f" Registered: {', '.join(names[0])}." if names else ""
        return f"{indent}{key} ({_type_name(f.annotation)}, default {dflt}): {f.description}{extra}"

    needle = (match or "").lower()
    for sec, cls in SECTIONS.items():
        section = []
        for key, f in fields_of(cls).items():
            section.append(line(f"{sec}.{key}", f, defaults[sec][key], "  "))
            sub = _subsection(f)
            if sub is not None:
                sub_defaults = defaults[sec][key] or {}
                section += [line(f"{sec}.{key}.{k}", g, sub_defaults.get(k, g.get_default(call_default_factory=True)),
                                 "    ") for k, g in fields_of(sub).items()]
        section = [x for x in section if needle in x.lower()]
        if section or not needle:
            lines += [f"{sec}:  {(cls.__doc__ or '').strip()}", *section]
    return "\n".join(lines)
