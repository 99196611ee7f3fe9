"""GRPO on compressed rollouts: the loop that strings the stations together.

    prompts → rollout (compressed sampler) → reward → score (dense old policy, reference)
            → correct (rejection, reweighting) → advantages → PPO-clip update → new weights into
            the sampler → metrics → checkpoint

``train_step`` is the whole step in one screen; each station is a function of its own module.
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..config import Config, config_to_dict, save_config
from ..correct import apply_corrections
from ..data import PromptSampler, load_dataset
from ..models.loading import load_model
from ..reward import load_reward, score_responses
from ..rollout.engine import RolloutEngine, RolloutOutput
from ..rollout.kv import compressor_from_fields
from ..rollout.sampling import SamplingParams
from ..score import forward_response, score_logprobs
from .advantages import compute_advantages, frac_zero_std_groups
from .batch import RolloutBatch
from .checkpoint import latest_checkpoint, load_checkpoint, remove_debris, save_checkpoint, set_rng_state
from .losses import agg_loss, kl_penalty, loss_normalizers, policy_loss
from .metrics import MetricsLogger


@dataclass
class Trainer:
    """What lives across steps: the learner, its optimizer, the sampler, the data, the reference."""

    cfg: Config
    learner: torch.nn.Module
    tokenizer: object
    engine: RolloutEngine
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    data: PromptSampler
    reward_fn: object
    ref: torch.nn.Module | None = None


def build_trainer(cfg: Config) -> Trainer:
    torch.manual_seed(cfg.train.seed)
    d = cfg.data
    data = load_dataset(d.train, prompt_key=d.prompt_key, label_key=d.label_key, template=d.template,
                        system_prompt=d.system_prompt, limit=d.limit,
                        skip_bad_rows=d.skip_bad_rows if d.skip_bad_rows else None)
    if data.skipped:
        print(f"data: {len(data)} examples from {data.source}, {data.skipped} bad rows skipped")
    lm = load_model(cfg.model.name, dtype=cfg.model.dtype, seed=cfg.model.seed, device=cfg.model.device)
    learner = lm.model.train()
    engine = RolloutEngine(lm, compressor_from_fields(cfg.rollout), dtype=cfg.rollout.dtype)
    t = cfg.train
    opt = torch.optim.AdamW(learner.parameters(), lr=t.lr, betas=tuple(t.betas), eps=t.eps, weight_decay=t.weight_decay)
    warm = max(1, t.warmup_steps)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm))
    ref = None
    if cfg.algorithm.kl_coef > 0:
        ref = copy.deepcopy(learner).eval().requires_grad_(False)
    return Trainer(cfg, learner, lm.tokenizer, engine, opt, sched,
                   PromptSampler(list(data), t.prompts_per_step, seed=t.seed), load_reward(cfg.reward.fn), ref)


def sampling_params(cfg: Config, step: int) -> SamplingParams:
    r = cfg.rollout
    return SamplingParams(n=r.n, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                          max_new_tokens=r.max_new_tokens, stop=list(r.stop), seed=cfg.train.seed * 1_000_003 + step)


def train_step(tr: Trainer, step: int) -> dict:
    """One RL step. Returns its metrics."""
    cfg, times = tr.cfg, {}
    clock = time.perf_counter()

    def lap(name):
        nonlocal clock
        now = time.perf_counter()
        times[f"time/{name}_s"] = now - clock
        clock = now

    examples = tr.data.next_batch()
    ro = tr.engine.generate([e.prompt for e in examples], sampling_params(cfg, step))
    lap("rollout")
    labels = [examples[i].label for i in ro.prompt_index]
    rewards, n_reward_errors = score_responses(tr.reward_fn, ro.texts, labels)
    lap("reward")
    batch = RolloutBatch.from_rollout(ro.prompt_ids, ro.response_ids, ro.sampler_logprobs, ro.prompt_index,
                                      pad_id=tr.tokenizer.pad_token_id or 0)
    batch.rewards = torch.tensor(rewards, dtype=torch.float32)
    temp = cfg.rollout.temperature
    batch.old_logprobs = score_logprobs(tr.learner, batch, cfg.train.micro_batch_size, temp)
    if tr.ref is not None:
        batch.ref_logprobs = score_logprobs(tr.ref, batch, cfg.train.micro_batch_size, temp)
    lap("score")
    a = cfg.algorithm
    corr = apply_corrections(a.correction, batch.sampler_logprobs, batch.old_logprobs, batch.response_mask,
                             a.correction_options or None)
    adv_options = {"scale_rewards": a.scale_rewards} if a.adv_estimator == "grpo" else {}
    batch.advantages = compute_advantages(a.adv_estimator, batch.rewards, batch.group_ids, **adv_options)
    update_metrics = update_policy(tr, batch, corr)
    tr.engine.update_weights(tr.learner)
    lap("update")
    return {**rollout_metrics(ro, batch, n_reward_errors, cfg), **corr.metrics, **update_metrics, **times,
            "throughput/rollout_tokens_per_s": ro.tokens_generated / max(times["time/rollout_s"], 1e-9)}


def update_policy(tr: Trainer, batch: RolloutBatch, corr) -> dict:
    """PPO-clip updates: mini-batches of whole groups (several optimizer steps when the mini-batch is
    smaller than the rollout batch), micro-batches with gradient accumulation, grad-norm clipping."""
    cfg, a, t = tr.cfg, tr.cfg.algorithm, tr.cfg.train
    N, T = batch.response_ids.shape
    mini = (t.mini_batch_prompts or t.prompts_per_step) * cfg.rollout.n
    adv = batch.advantages
    sums: dict[str, float] = {}
    count, grad_norms = 0, []
    tr.learner.train()
    for _epoch in range(t.ppo_epochs):
        for ms in range(0, N, mini):
            rows = slice(ms, min(ms + mini, N))
            norms = loss_normalizers(corr.mask[rows], a.loss_agg, max_len=cfg.rollout.max_new_tokens)
            tr.optimizer.zero_grad(set_to_none=True)
            for mb in range(rows.start, rows.stop, t.micro_batch_size):
                r = slice(mb, min(mb + t.micro_batch_size, rows.stop))
                lp, ent = forward_response(tr.learner, batch, r, return_entropy=True, entropy_grad=bool(a.entropy_coef),
                                           temperature=cfg.rollout.temperature)
                scale = corr.clip_upper_scale[r] if corr.clip_upper_scale is not None else None
                loss, m = policy_loss(lp, corr.behaviour_logprobs[r], adv[r], corr.mask[r], corr.weights[r],
                                      clip_eps=a.clip_eps, clip_eps_high=a.clip_eps_high, clip_upper_scale=scale, **norms)
                mask = batch.response_mask[r]
                m["policy/entropy"] = float((ent.detach() * mask).sum() / mask.sum().clamp(min=1))
                if tr.ref is not None:
                    kl_tok = kl_penalty(lp, batch.ref_logprobs[r], a.kl_kind)
                    loss = loss + a.kl_coef * agg_loss(kl_tok, corr.mask[r], **norms)
                    m["policy/kl_ref"] = float((kl_tok.detach() * mask).sum() / mask.sum().clamp(min=1))
                if a.entropy_coef:  # entropy bonus (maximise entropy)
                    loss = loss - a.entropy_coef * agg_loss(ent, corr.mask[r], **norms)
                loss.backward()
                m["policy/loss"] = float(loss.detach())
                w = float(mask.sum())
                for k, v in m.items():
                    sums[k] = sums.get(k, 0.0) + v * (1.0 if k == "policy/loss" else w)
                count += w
            gn = torch.nn.utils.clip_grad_norm_(tr.learner.parameters(), t.grad_clip or float("inf"))
            grad_norms.append(float(gn))
            tr.optimizer.step()
        # the scheduler counts RL steps, not optimizer steps
    tr.scheduler.step()
    # micro-batch losses add up to each optimizer step's loss; report the mean over optimizer steps
    out = {k: (v / max(1, len(grad_norms)) if k == "policy/loss" else v / max(count, 1.0)) for k, v in sums.items()}
    out.setdefault("policy/kl_ref", 0.0)
    out["grad_norm"] = sum(grad_norms) / max(1, len(grad_norms))
    out["lr"] = tr.optimizer.param_groups[0]["lr"]
    return out


def rollout_metrics(ro: RolloutOutput, batch: RolloutBatch, n_reward_errors: int, cfg: Config) -> dict:
    r = batch.rewards
    lengths = batch.response_mask.sum(-1)
    dense = max(ro.kv.bytes_dense, 1)
    return {
        "reward/mean": float(r.mean()),
        "reward/std": float(r.std()) if r.numel() > 1 else 0.0,
        "accuracy": float((r >= 1.0).float().mean()),
        "reward/errors": n_reward_errors,
        "frac_zero_std_groups": frac_zero_std_groups(r, batch.group_ids),
        "response/length_mean": float(lengths.mean()),
        "response/length_max": float(lengths.max()),
        "response/clipped_frac": sum(f == "length" for f in ro.finish_reason) / len(ro.finish_reason),
        "kv/bytes_peak": ro.kv.bytes_peak,
        "kv/bytes_dense": ro.kv.bytes_dense,
        "kv/compression_ratio": dense / max(ro.kv.bytes_theory, 1),
        # per response: cached tokens at its end over the tokens a dense cache would hold
        "kv/kept_frac_final": sum(k / max(1, len(p) + len(r) - 1) for k, p, r in
                                  zip(ro.kv_tokens_kept, ro.prompt_ids, ro.response_ids)) / max(1, len(ro.response_ids)),
        "kv/compressions": ro.kv.compressions,
    }


def resolve_run_dir(cfg: Config, run_dir: str | None) -> Path:
    if run_dir:
        return Path(run_dir)
    name = cfg.log.run_name or f"{time.strftime('%Y%m%d-%H%M%S')}-{cfg.name}"
    return Path(cfg.log.out_dir) / name


def train(cfg: Config, resume: bool = False, run_dir: str | Path | None = None, log=print) -> Path:
    """Run (or resume) a training run; returns its folder."""
    run = resolve_run_dir(cfg, str(run_dir) if run_dir else None)
    if resume:
        remove_debris(run)
    ckpt = latest_checkpoint(run) if resume else None
    if resume and ckpt is None and (run / "metrics.jsonl").exists():
        log(f"no complete checkpoint in {run}: starting from step 0")
    run.mkdir(parents=True, exist_ok=True)
    save_config(cfg, run / "config.yaml")
    tr = build_trainer(cfg)
    start = 0
    if ckpt is not None:
        state = load_checkpoint(ckpt, tr.learner, tr.optimizer, tr.scheduler)
        tr.data.load_state_dict(state["data"])
        set_rng_state(state["rng"])
        tr.engine.update_weights(tr.learner)
        start = int(state["step"])
        log(f"resumed from {ckpt} (step {start})")
    logger = MetricsLogger(run, tensorboard=cfg.log.tensorboard, wandb=cfg.log.wandb, wandb_project=cfg.log.wandb_project,
                           config_dict=config_to_dict(cfg), progress=cfg.log.progress, total_steps=cfg.train.steps)
    if start:
        logger.truncate_after(start)
    try:
        for step in range(start + 1, cfg.train.steps + 1):
            metrics = train_step(tr, step)
            logger.log(step, metrics)
            if step % max(1, cfg.checkpoint.every) == 0 or step == cfg.train.steps:
                save_checkpoint(run, step, tr.learner, tr.tokenizer, tr.optimizer, tr.scheduler,
                                {"data": tr.data.state_dict()}, keep_last=cfg.checkpoint.keep_last)
    finally:
        logger.close()
    if cfg.data.eval:
        from ..eval.evaluate import evaluate_trainer

        evaluate_trainer(tr, run, log=log)
    from ..eval.report import make_report

    report = make_report(run)
    last = latest_checkpoint(run)
    log(f"run folder: {run}\n  metrics:    {run / 'metrics.jsonl'} (TensorBoard: {run / 'tb'})\n"
        f"  checkpoint: {last / 'model' if last else None}\n  report:     {report}")
    return run
