"""``sparserl bench learner``: the learner's step in float32 against bfloat16 mixed precision
(``model.mixed_precision``), on a real rollout of a config's job, in one process.

1. The config's trainer is built and samples one rollout batch (its step 1: the job's prompts,
   responses, rewards and sampler log-probs); each precision's update takes its corrections from the
   old policy scored in that precision, as a run in it would.
2. Numerics, on the initial weights: the old policy's log-probs of the batch in each precision, k3 and
   the largest |Δ log p| of bfloat16 against float32 over the response tokens; the update's gradient in
   each precision (read as the optimizer's step begins), their cosine and the relative L2 distance; and,
   for the scale of GRPO's own sampling noise, the cosine of two float32 gradients each from half of
   the groups (the other half's advantages set to 0).
3. Speed: ``--repeat`` rounds; in each, both precisions (the order alternating round to round) time the
   old policy's scoring forward and the update (forwards, backward, clipping, AdamW: the trainer's own
   ``update_policy``), the learner's weights and optimizer state restored after every update so every
   round starts from the same point. Reported per precision per round, and as the median of the
   per-round ratios float32 seconds / bfloat16 seconds (a round at half speed moves both sides).
   Where the config's step is one optimizer step over one micro-batch, each round also times
   ``algorithm.old_logprobs=update`` in each precision (the update's forward, the corrections from its
   detached log-probs, the update on it: no scoring forward), reported as the median of per-round
   ratios (scoring + update) / that.

The machine record names what ``model.mixed_precision: auto`` chooses on it, and why.
"""

from __future__ import annotations

import copy
import os
import statistics
import time
from dataclasses import asdict

import torch

from ..config import ConfigError
from ..models.mixed_precision import autocast_for
from ..models.mixed_precision import choose as choose_mixed_precision
from ..reward.weighted import score_rewards
from ..rollout import native
from ..rollout.dtype_auto import cpu_name
from ..score import model_dropout, score_logprobs
from ..train.trainer import build_trainer, corrections_and_advantages, rollout, rollout_batch, update_policy
from ..train.update_forward import run_update_forward

MODES = ("off", "bfloat16")
_NAMES = {"off": "float32", "bfloat16": "bfloat16_mixed"}  # the report's names of the modes


def _score(trainer, batch, mode: str) -> torch.Tensor:
    cfg = trainer.cfg
    with autocast_for(mode, trainer.device):
        return score_logprobs(
            trainer.learner,
            batch,
            cfg.train.micro_batch_size,
            cfg.rollout.temperature,
            cfg.train.shared_prompt,
            cfg.train.max_tokens_per_micro_batch,
        )


def _dot(a: torch.Tensor, b: torch.Tensor, chunk: int = 1 << 22) -> float:
    """Σ a·b in float64, a chunk at a time (no float64 copy of a whole gradient)."""
    return sum(float(a[s : s + chunk].double() @ b[s : s + chunk].double()) for s in range(0, a.numel(), chunk))


def _distance2(a: torch.Tensor, b: torch.Tensor, chunk: int = 1 << 22) -> float:
    """Σ (a − b)² in float64, a chunk at a time."""
    return sum(
        float((a[s : s + chunk].double() - b[s : s + chunk].double()).square().sum())
        for s in range(0, a.numel(), chunk)
    )


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return _dot(a, b) / max(_dot(a, a) * _dot(b, b), 1e-300) ** 0.5


def _k3(log_q: torch.Tensor, log_p: torch.Tensor, mask: torch.Tensor) -> float:
    lr = (log_p - log_q).double()[mask.bool()]
    return float((lr.exp() - 1 - lr).mean()) if lr.numel() else 0.0


class _State:
    """The learner's weights and optimizer state at one point, put back after every timed update."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.weights = copy.deepcopy(trainer.learner.state_dict())
        self.optimizer = copy.deepcopy(trainer.optimizer.state_dict())
        self.scheduler = copy.deepcopy(trainer.scheduler.state_dict())

    def restore(self) -> None:
        self.trainer.learner.load_state_dict(self.weights)
        self.trainer.optimizer.load_state_dict(copy.deepcopy(self.optimizer))
        self.trainer.scheduler.load_state_dict(self.scheduler)


def _update(trainer, batch, corr, mode: str, want_grad: bool = False, update_forward=None):
    """The trainer's update in ``mode``; with ``want_grad``, the flat gradient the optimizer stepped on;
    ``update_forward``: its forward, run before (``algorithm.old_logprobs=update``)."""
    grads = []

    def keep(optimizer, *_):
        grads.append(
            torch.cat(
                [
                    p.grad.detach().flatten().float()
                    for g in optimizer.param_groups
                    for p in g["params"]
                    if p.grad is not None
                ]
            )
        )

    hook = trainer.optimizer.register_step_pre_hook(keep) if want_grad else None
    before = trainer.cfg.model.mixed_precision
    trainer.cfg.model.mixed_precision = mode
    try:
        update_policy(trainer, batch, corr, update_forward)
    finally:
        trainer.cfg.model.mixed_precision = before
        if hook is not None:
            hook.remove()
    return grads[0] if grads else None


def _forward_and_update(trainer, batch, mode: str) -> None:
    """``algorithm.old_logprobs=update``'s path in ``mode``: the update's forward, the old policy's log-probs
    from it, the corrections, and the update on that forward."""
    cfg = trainer.cfg
    with autocast_for(mode, trainer.device):
        forward = run_update_forward(
            trainer.learner,
            batch,
            shared_prompt=cfg.train.shared_prompt,
            temperature=cfg.rollout.temperature,
            entropy_grad=bool(cfg.algorithm.entropy_coef),
            keep_hidden=False,
        )
    batch.old_logprobs = forward.old_logprobs
    _update(trainer, batch, corrections_and_advantages(cfg, batch), mode, update_forward=forward)


def run_bench(cfg, repeat: int = 3, log=print) -> dict:
    """The report (see the module docstring) for the validated config ``cfg``."""
    if cfg.model.dtype != "float32":  # before anything loads
        raise ConfigError(
            f"model.dtype={cfg.model.dtype}: bench learner runs float32 weights in float32 and in "
            "bfloat16 mixed precision; set model.dtype=float32"
        )
    trainer = build_trainer(cfg)
    examples, ro = rollout(trainer, 1)
    asked = [examples[i] for i in ro.prompt_index]
    scores = score_rewards(trainer.reward_fn, ro.texts, [e.label for e in asked], [e.prompt_text for e in asked])
    batch = rollout_batch(trainer, ro, scores.total)
    mask = batch.response_mask
    logprobs, corr = {}, {}
    for mode in MODES:
        logprobs[mode] = batch.old_logprobs = _score(trainer, batch, mode)
        corr[mode] = corrections_and_advantages(cfg, batch)
    state = _State(trainer)
    grads = {}
    for mode in MODES:
        grads[mode] = _update(trainer, batch, corr[mode], mode, want_grad=True)
        state.restore()
    advantages = batch.advantages  # the scale of GRPO's own noise: float32 gradients of two halves of the groups
    groups = batch.group_ids.unique()
    first_half = torch.isin(batch.group_ids, groups[: len(groups) // 2])
    for name, part in (("half_a", first_half), ("half_b", ~first_half)):
        batch.advantages = advantages * part.view(-1, *[1] * (advantages.dim() - 1))
        grads[name] = _update(trainer, batch, corr["off"], "off", want_grad=True)
        state.restore()
    batch.advantages = advantages
    g32, g16 = grads["off"], grads["bfloat16"]
    diff = (logprobs["bfloat16"] - logprobs["off"])[mask.bool()]
    numerics = {
        "k3_bf16_vs_float32": _k3(logprobs["off"], logprobs["bfloat16"], mask),
        "max_abs_logprob_diff": float(diff.abs().max()) if diff.numel() else 0.0,
        # None where a gradient is 0 (every group's rewards tie)
        "grad_cosine": None,
        "grad_rel_l2": None,
        "grad_cosine_halves_float32": None,
    }
    if _dot(g32, g32) > 0:
        numerics["grad_cosine"] = _cosine(g32, g16)
        numerics["grad_rel_l2"] = (_distance2(g16, g32) / _dot(g32, g32)) ** 0.5
    if _dot(grads["half_a"], grads["half_a"]) > 0 and _dot(grads["half_b"], grads["half_b"]) > 0:
        numerics["grad_cosine_halves_float32"] = _cosine(grads["half_a"], grads["half_b"])
    del grads, g32, g16
    gradient = (
        f"gradient cosine {numerics['grad_cosine']:.5f}, relative L2 {numerics['grad_rel_l2']:.4f}"
        if numerics["grad_cosine"] is not None
        else "gradient 0 (every group's rewards tie): not compared"
    )
    if numerics["grad_cosine_halves_float32"] is not None:
        gradient += (
            f" (float32, half the groups against the other half: cosine {numerics['grad_cosine_halves_float32']:.3f})"
        )
    log(
        f"numerics: k3 {numerics['k3_bf16_vs_float32']:.2e}, max |Δ log p| {numerics['max_abs_logprob_diff']:.3f}, "
        + gradient
    )
    why_not_update = cfg.why_update_forward_is_not_old_policy(model_dropout(trainer.learner))
    if why_not_update is not None:
        log(f"old_logprobs=update not timed: {why_not_update}")
    seconds = {mode: {"score": [], "update": [], "update_forward": []} for mode in MODES}
    for r in range(repeat):
        for mode in MODES if r % 2 == 0 else MODES[::-1]:
            start = time.perf_counter()
            _score(trainer, batch, mode)
            scored = time.perf_counter()
            _update(trainer, batch, corr[mode], mode)
            done = time.perf_counter()
            state.restore()
            seconds[mode]["score"].append(scored - start)
            seconds[mode]["update"].append(done - scored)
            if why_not_update is None:
                start = time.perf_counter()
                _forward_and_update(trainer, batch, mode)
                seconds[mode]["update_forward"].append(time.perf_counter() - start)
                state.restore()
        log(
            f"round {r + 1}: "
            + ", ".join(
                f"{mode}: score {seconds[mode]['score'][-1]:.2f} s, update {seconds[mode]['update'][-1]:.2f} s"
                + (
                    f", old_logprobs=update {seconds[mode]['update_forward'][-1]:.2f} s"
                    if why_not_update is None
                    else ""
                )
                for mode in MODES
            )
        )
    f32, b16 = seconds["off"], seconds["bfloat16"]
    ratios = {
        "score": [a / b for a, b in zip(f32["score"], b16["score"])],
        "update": [a / b for a, b in zip(f32["update"], b16["update"])],
        "score_and_update": [
            (a + b) / (c + d) for a, b, c, d in zip(f32["score"], f32["update"], b16["score"], b16["update"])
        ],
    }
    speedup = {k: statistics.median(v) for k, v in ratios.items()}
    log(
        "bfloat16 mixed precision against float32 (median of per-round ratios): "
        + ", ".join(f"{k} {v:.2f}x" for k, v in speedup.items())
    )
    update_forward = {"why_not": why_not_update}
    if why_not_update is None:  # per precision: (scoring + update) / the update-forward path, round by round
        for mode in MODES:
            rounds = [
                (a + b) / c
                for a, b, c in zip(seconds[mode]["score"], seconds[mode]["update"], seconds[mode]["update_forward"])
            ]
            update_forward[_NAMES[mode]] = {"ratio_rounds": rounds, "speedup": statistics.median(rounds)}
        log(
            "old_logprobs=update against a scoring forward + update (median of per-round ratios): "
            + ", ".join(f"{_NAMES[m]} {update_forward[_NAMES[m]]['speedup']:.2f}x" for m in MODES)
        )
    lengths = mask.sum(-1)
    return {
        "bench": "learner",
        "model": cfg.model.name,
        "device": str(trainer.device),
        "machine": {
            "cpu": cpu_name(),
            "isa": native.isa(),
            "cores": os.cpu_count(),
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "gpu": torch.cuda.get_device_name(trainer.device) if trainer.device.type == "cuda" else None,
            "mixed_precision_auto": asdict(choose_mixed_precision(trainer.device)),
        },
        "batch": {
            "sequences": int(batch.size),
            "prompts": len(set(ro.prompt_index)),
            "prompt_tokens_mean": statistics.mean(len(p) for p in ro.prompt_ids),
            "response_tokens_mean": float(lengths.float().mean()),
            "response_tokens_max": int(lengths.max()),
            "micro_batch_size": cfg.train.micro_batch_size,
            "shared_prompt": cfg.train.shared_prompt,
        },
        "repeat": repeat,
        "seconds": {_NAMES[m]: v for m, v in seconds.items()},
        "ratio_rounds": ratios,
        "speedup_bf16_mixed": speedup,
        "speedup_update_forward": update_forward,
        "numerics": numerics,
    }
