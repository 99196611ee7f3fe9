"""Predicted time of one GRPO step, station by station, from the shapes and the machine's rates.

The stations are those of :func:`sparserl.train.step.train_step`, under the run log's names
(:mod:`sparserl.runlog`: ``time/rollout_s``, ``time/reward_s``, ``time/score_s``, ``time/alpha_s``,
``time/update_s``; ``time/push_s`` is part of ``time/update_s``), so that a prediction sits beside a
measured step (``sparserl bench step``) key for key.

Notation as in :mod:`.rollout`, plus: N responses of lengths L_i (T_out = Σ L_i response tokens), G
prompts of L_in tokens (G = N / n with the prompt forwarded once per group, ``train.shared_prompt``;
else G = N), T = G L_in + T_out the tokens through the learner, P_L = P_w − V h the layers' weights,
b the learner's bytes per weight, F_p the GEMM rate at many rows (:attr:`MachineRates.prefill_rate`),
M = ⌈T / T_mb⌉ micro-batches of at most T_mb tokens (``train.max_tokens_per_micro_batch``).

**Rollout**: :func:`~.rollout.rollout_cost_lengths` (rows leave the batch as they end).

**One learner forward** (old-policy scoring, the reference's, and the update's forward) is two GEMM
groups and the log-softmax, each at its roofline, in sequence::

    layers:  flops = 2 P_L T + 4 ℓ H_q d A,   A = G L_in² / 2 + Σ_i (L_i L_in + L_i² / 2)   (causal)
             bytes = M P_L b                                      t_layers = max(bytes / BW, flops / F_p)
    head:    flops = 2 V h T_out,  bytes = M V h b                t_head   = max(bytes / BW, flops / F_p)
    logits:  bytes = c_sm 4 T_out V   (c_sm = 3 passes over float32 logits: written, reduced, normalised)

(the LM head on the response tokens only: log-probs are read there alone).

**Scoring** (``time/score_s``): one forward, plus one for the reference model when there is one; none
when the old log-probs come from the update's own forward (``algorithm.old_logprobs=update``) or the
sampler (``sampler``).

**α** (``time/alpha_s``, ``mismatch.alpha=exact``), by where q comes from (``mismatch.alpha_q``):

    hidden:  2 head products, 2 · 2 T_out V h FLOPs at F_p  +  bytes (2 c_sm + 2) 4 T_out V
             (p's and q's logits from the learner's and the sampler's final hidden states, each
             softmaxed; then Σ_x min(p, q) reads both)
    kept:    1 head product (p)  +  bytes (c_sm + 1 + 2) 4 T_out V   (q written while sampling, read back)
    replay:  the rollout once more (the sampler re-run on its own tokens) + as kept
    topk / off: 0 (top-k log-probs come with the rollout)

**Update** (``time/update_s``): per PPO epoch, forward and backward = 3 forwards of the GEMM groups (the
backward's two products per weight: the input's gradient and the weight's), one more of the layers under
gradient checkpointing (it recomputes each decoder layer's forward; the LM head is outside it), and
2 c_sm passes over the logits (forward and backward); then the AdamW step, 28 bytes per parameter
(float32 θ, g, m, v read; θ, m, v written), and the push (``time/push_s``): the learner's weights read
and the sampler's written, P (b + b_w) bytes.

**Reward** (``time/reward_s``): string matching, not modelled (0).

Left out: padding inside micro-batches, the learner's elementwise kernels (norms, activations, RoPE)
and activation traffic, communication between GPUs, Python overheads, the sampling's passes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Literal

from .. import runlog as names
from .rollout import Cost, MachineRates, ModelShape, rollout_cost_lengths

__all__ = [
    "ADAMW_BYTES_PER_PARAM",
    "SOFTMAX_PASSES",
    "STATIONS",
    "Step",
    "forward_cost",
    "spread_lengths",
    "step_cost",
    "with_weight_bytes",
]

#: the step's stations as the run log names them, in the order of a step (they sum to time/step_s)
STATIONS = (names.TIME_ROLLOUT, names.TIME_REWARD, names.TIME_SCORE, names.TIME_ALPHA, names.TIME_UPDATE)
#: passes over the float32 logits of a log-softmax (written, reduced, normalised): c_sm
SOFTMAX_PASSES = 3
#: AdamW in float32: θ, g, m, v read, θ, m, v written
ADAMW_BYTES_PER_PARAM = 28
_LOGIT_BYTES = 4  # float32 logits


@dataclass(frozen=True)
class Forward:
    """One learner forward's seconds by kernel group (``seconds`` their sum)."""

    layers_s: float
    head_s: float
    logits_s: float
    layer_flops: float
    head_flops: float
    micro_batches: int

    @property
    def seconds(self) -> float:
        return self.layers_s + self.head_s + self.logits_s


@dataclass(frozen=True)
class Step:
    """A predicted step: ``stations`` (run-log names → seconds) sum to ``seconds`` (``time/step_s``);
    ``parts`` breaks stations down (``time/push_s`` is part of ``time/update_s``)."""

    seconds: float
    stations: dict[str, float]
    parts: dict[str, float]
    rollout: Cost
    method: str
    responses: int
    response_tokens: int
    learner_tokens: int
    options: dict = field(default_factory=dict)

    @property
    def rollout_fraction(self) -> float:
        return self.stations[names.TIME_ROLLOUT] / self.seconds

    def to_dict(self) -> dict:
        return {
            names.TIME_STEP: self.seconds,
            **self.stations,
            "parts": dict(self.parts),
            "rollout_fraction": self.rollout_fraction,
            "method": self.method,
            "responses": self.responses,
            "response_tokens": self.response_tokens,
            "learner_tokens": self.learner_tokens,
            "options": dict(self.options),
            "rollout": self.rollout.to_dict(),
        }


def spread_lengths(n: int, low: int, high: int) -> list[int]:
    """``n`` response lengths spread evenly over [low, high] (the midpoints of n equal slices; all
    ``high`` when low == high)."""
    if not (isinstance(n, int) and n >= 1 and 1 <= low <= high):
        raise ValueError(f"spread_lengths: need n >= 1 and 1 <= low <= high, got n={n!r}, {low!r}-{high!r}")
    return [round(low + (high - low) * (i + 0.5) / n) for i in range(n)]


def forward_cost(
    learner: ModelShape,
    rates: MachineRates,
    prompt_len: int,
    response_lens: list[int] | tuple[int, ...],
    prompts: int,
    micro_batch_tokens: int | None = 16384,
) -> Forward:
    """One learner forward over ``prompts`` prompts of ``prompt_len`` tokens and the responses
    ``response_lens`` (the module docstring's formula)."""
    ell, hq, d = learner.layers, learner.heads, learner.head_dim
    head = learner.vocab * learner.hidden
    layer_w = learner.decode_weights - head
    t_out = sum(response_lens)
    tokens = prompts * prompt_len + t_out
    micro = math.ceil(tokens / micro_batch_tokens) if micro_batch_tokens else 1
    pairs = prompts * prompt_len**2 / 2 + sum(n * prompt_len + n * n / 2 for n in response_lens)
    layer_flops = 2.0 * layer_w * tokens + 4.0 * ell * hq * d * pairs
    head_flops = 2.0 * head * t_out
    bw, fp = rates.bandwidth, rates.prefill_rate
    head_b = learner.weight_bytes if learner.head_bytes is None else learner.head_bytes
    return Forward(
        layers_s=max(micro * layer_w * learner.weight_bytes / bw, layer_flops / fp),
        head_s=max(micro * head * head_b / bw, head_flops / fp),
        logits_s=SOFTMAX_PASSES * _LOGIT_BYTES * t_out * learner.vocab / bw,
        layer_flops=layer_flops,
        head_flops=head_flops,
        micro_batches=micro,
    )


def step_cost(
    shape: ModelShape,
    rates: MachineRates,
    prompt_len: int,
    response_lens: list[int] | tuple[int, ...],
    *,
    learner: ModelShape | None = None,
    learner_rates: MachineRates | None = None,
    group_size: int = 1,
    shared_prompt: bool = True,
    old_logprobs: Literal["score", "update", "sampler"] = "score",
    ref_model: bool = False,
    alpha_q: Literal["hidden", "kept", "replay", "topk", "off"] = "hidden",
    gradient_checkpointing: bool = False,
    ppo_epochs: int = 1,
    micro_batch_tokens: int | None = 16384,
    **sparsity,
) -> Step:
    """Predicted seconds of one GRPO step per station (the module docstring's formulas).

    ``shape``/``rates``: the sampler's model (its bytes per weight: bfloat16, int8 ...) and machine;
    ``learner``/``learner_rates``: the learner's (default: the sampler's shape and rates); ``group_size``:
    responses per prompt (``rollout.n``), whose prompt the learner forwards once with ``shared_prompt``;
    ``old_logprobs``: where the old log-probs come from (``score``: a forward of their own; ``update``,
    ``sampler``: none); ``ref_model``: a reference model scored too; ``alpha_q``: exact α's q (``hidden``,
    ``kept``, ``replay``) or ``topk`` / ``off`` (no α station); ``gradient_checkpointing``: one more
    forward of the layers in the update; ``micro_batch_tokens``: the learner's token budget per
    micro-batch (None: one micro-batch). ``sparsity``: the rollout's compressor, as
    :func:`~.rollout.rollout_cost`'s keyword arguments (none: dense). Bad input raises ``ValueError``."""
    learner = learner if learner is not None else shape
    learner_rates = learner_rates if learner_rates is not None else rates
    if not isinstance(learner, ModelShape) or not isinstance(learner_rates, MachineRates):
        raise ValueError("step_cost: learner must be a ModelShape and learner_rates a MachineRates")
    if (learner.layers, learner.hidden, learner.vocab) != (shape.layers, shape.hidden, shape.vocab):
        raise ValueError("step_cost: the learner and the sampler must be the same model (layers, hidden, vocab)")
    for name, v, low in (("group_size", group_size, 1), ("ppo_epochs", ppo_epochs, 1)):
        if not isinstance(v, int) or isinstance(v, bool) or v < low:
            raise ValueError(f"step_cost: {name} must be an integer >= {low}, got {v!r}")
    if old_logprobs not in ("score", "update", "sampler"):
        raise ValueError(f"step_cost: old_logprobs must be score, update or sampler, got {old_logprobs!r}")
    if alpha_q not in ("hidden", "kept", "replay", "topk", "off"):
        raise ValueError(f"step_cost: alpha_q must be hidden, kept, replay, topk or off, got {alpha_q!r}")
    if micro_batch_tokens is not None and (not isinstance(micro_batch_tokens, int) or micro_batch_tokens < 1):
        raise ValueError(f"step_cost: micro_batch_tokens must be an integer >= 1 or None, got {micro_batch_tokens!r}")

    ro = rollout_cost_lengths(shape, rates, prompt_len, response_lens, **sparsity)
    n = len(response_lens)
    t_out = sum(response_lens)
    prompts = math.ceil(n / group_size) if shared_prompt else n
    fwd = forward_cost(learner, learner_rates, prompt_len, response_lens, prompts, micro_batch_tokens)
    bw, fp = learner_rates.bandwidth, learner_rates.prefill_rate
    head = shape.vocab * shape.hidden
    logits = _LOGIT_BYTES * t_out * shape.vocab  # one pass over one distribution's float32 logits

    parts: dict[str, float] = {}
    score_s = (fwd.seconds if old_logprobs == "score" else 0.0) + (fwd.seconds if ref_model else 0.0)

    alpha_s = 0.0
    if alpha_q == "hidden":
        alpha_s = 2 * 2.0 * head * t_out / fp + (2 * SOFTMAX_PASSES + 2) * logits / bw
    elif alpha_q in ("kept", "replay"):
        alpha_s = 2.0 * head * t_out / fp + (SOFTMAX_PASSES + 3) * logits / bw
        if alpha_q == "replay":
            parts["alpha/replay_s"] = ro.seconds
            alpha_s += ro.seconds

    gemm_s = fwd.layers_s + fwd.head_s
    per_epoch = 3 * gemm_s + (fwd.layers_s if gradient_checkpointing else 0.0) + 2 * fwd.logits_s
    forward_backward_s = ppo_epochs * per_epoch
    optimizer_s = ppo_epochs * ADAMW_BYTES_PER_PARAM * learner.params / bw
    push_s = learner.params * (learner.weight_bytes + shape.weight_bytes) / rates.bandwidth
    parts.update(
        {
            "update/forward_backward_s": forward_backward_s,
            "update/optimizer_s": optimizer_s,
            names.TIME_PUSH: push_s,
            "learner/forward_s": fwd.seconds,
            "learner/micro_batches": float(fwd.micro_batches),
        }
    )
    stations = {
        names.TIME_ROLLOUT: ro.seconds,
        names.TIME_REWARD: 0.0,
        names.TIME_SCORE: score_s,
        names.TIME_ALPHA: alpha_s,
        names.TIME_UPDATE: forward_backward_s + optimizer_s + push_s,
    }
    return Step(
        seconds=sum(stations.values()),
        stations=stations,
        parts=parts,
        rollout=ro,
        method=ro.method,
        responses=n,
        response_tokens=t_out,
        learner_tokens=prompts * prompt_len + t_out,
        options={
            "old_logprobs": old_logprobs,
            "ref_model": ref_model,
            "alpha_q": alpha_q,
            "gradient_checkpointing": gradient_checkpointing,
            "ppo_epochs": ppo_epochs,
            "group_size": group_size,
            "shared_prompt": shared_prompt,
            "micro_batch_tokens": micro_batch_tokens,
        },
    )


def with_weight_bytes(shape: ModelShape, weight_bytes: float, head_bytes: float | None = None) -> ModelShape:
    """``shape`` with its layers' weights held at ``weight_bytes`` (int8: 1, fp8: 1) and its LM head at
    ``head_bytes`` (None: as before, e.g. an int8 sampler whose head stays float)."""
    head = head_bytes if head_bytes is not None else (shape.head_bytes or shape.weight_bytes)
    return replace(shape, weight_bytes=float(weight_bytes), head_bytes=float(head))
