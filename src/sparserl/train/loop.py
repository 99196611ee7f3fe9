"""A training run (:func:`train`): check what is cheap to check, build the trainer once, resume from the
newest checkpoint, then step, evaluate, log and checkpoint to the end, and print the summary.
"""

from __future__ import annotations

from pathlib import Path

from .. import runlog as names
from ..checks import check_output_dir
from ..config import Config, config_to_dict
from ..eval.report import make_report
from ..memory.allocator import returned_bytes
from ..models.invariant_scaling import refold_after_load
from ..models.mixed_precision import choose as choose_mixed_precision
from ..runlog import read_metrics
from .build import Trainer, build_trainer, close_cluster
from .checkpoint import latest_checkpoint, load_latest, remove_debris, save_checkpoint, set_rng_state
from .determinism import deterministic_state, naming_nondeterministic_ops, restore_deterministic_state
from .due import checkpoint_due, eval_due
from .headline import headline_lines
from .held_out import held_out_eval
from .metrics import MetricsLogger
from .run_folder import (
    CONFIG_FILE,
    ResumeError,
    check_resume_config,
    checkpoint_step,
    find_resume_folder,
    holds_run,
    record_config,
    resolve_run_dir,
)
from .sampler_sync import push_weights
from .step import train_step
from .summary import run_summary


def train(
    cfg: Config, resume: bool = False, run_dir: str | Path | None = None, log=print, allow_config_change: bool = False
) -> Path:
    """Run (or resume) a training run; returns its folder.

    ``resume``: continue the run in ``run_dir`` (see :func:`find_resume_folder` without it) from its
    newest complete checkpoint; it must exist, and ``cfg`` may differ from the config the run ran with
    only in :data:`RESUME_FREE_KEYS` unless ``allow_config_change``. Every config the run runs with is
    kept (:func:`recorded_configs`). Without ``resume`` the folder must not hold a run already.
    Everything that can be checked cheaply is checked before the model loads.
    """
    option = "--run-dir" if run_dir else "log.out_dir"
    changes: list = []
    if resume:
        run = find_resume_folder(cfg, run_dir, log)
        changes = check_resume_config(run, cfg, allow_config_change)
        have = checkpoint_step(latest_checkpoint(run))
        if have is not None and have > cfg.train.steps:
            raise ResumeError(
                f"--resume: {run} is at step {have} already, more than train.steps="
                f"{cfg.train.steps}: give train.steps={have} or more"
            )
    else:
        run = resolve_run_dir(cfg, str(run_dir) if run_dir else None)
        if holds_run(run):
            raise ResumeError(
                f"{option} {run} already holds a run ({names.METRICS_FILE} or checkpoints/): "
                "continue it with --resume, or choose another run folder"
            )
    check_output_dir(run, option)
    kernels = deterministic_state()
    trainer = build_trainer(cfg)  # sparserl.preflight's checks first, before any weight loads
    try:
        return run_steps(trainer, run, resume, changes, log)
    finally:  # the rollout workers, the other learners and a Ray started for the run stop with it
        close_cluster(trainer)
        restore_deterministic_state(kernels)  # train.deterministic's kernels for the run only


def resume_from_checkpoint(trainer: Trainer, run: Path, log=print) -> int:
    """Load the newest complete checkpoint of ``run`` into ``trainer`` (weights, optimizer, schedule, data
    position, RNG, the controller's budgets, the non-finite streak) and push its weights to the sampler and
    the other learners; returns its step (0 when there is none)."""
    cfg = trainer.cfg
    found = load_latest(
        run, trainer.learner, trainer.optimizer, trainer.scheduler, log=log, sampler_adapter=trainer.distill
    )
    if found is None:
        if (run / names.METRICS_FILE).exists():
            log(f"no complete checkpoint in {run}: starting from step 0")
        return 0
    ckpt, state = found
    try:
        trainer.data.load_state_dict(state["data"])
    except (ValueError, KeyError, TypeError) as e:
        raise ResumeError(
            f"{ckpt / 'trainer.json'}: the saved data position does not fit data.train={cfg.data.train!r} ({e})"
        ) from None
    set_rng_state(state["rng"])
    if trainer.kv_controller is not None and "kv_controller" in state:
        trainer.kv_controller.load_state_dict(state["kv_controller"])
        trainer.engine.compressor.set_schedule(trainer.kv_controller.schedule())
    if "nonfinite" in state:
        trainer.nonfinite.load_state_dict(state["nonfinite"])
    refold_after_load(trainer.learner)  # checkpoints hold the original form (QuRL's s taken out)
    push_weights(trainer)
    if trainer.learners is not None:
        trainer.learners.sync(trainer)
    start = int(state["step"])
    log(f"resumed from {ckpt} (step {start})")
    return start


def machine_notes(trainer: Trainer) -> list[str]:
    """What ``auto`` settings chose on this machine (``rollout.dtype``, ``model.mixed_precision``)."""
    cfg, choice = trainer.cfg, trainer.engine.dtype_choice
    notes = [f"rollout.dtype: auto -> {choice.dtype} on this machine: {choice.reason} [{choice.key}]"] if choice else []
    if cfg.model.mixed_precision == "auto" and cfg.model.dtype == "float32":  # what `auto` measured here
        precision = choose_mixed_precision(trainer.device)
        notes.append(
            f"model.mixed_precision: auto -> {precision.mode} on this machine: {precision.reason} [{precision.key}]"
        )
    return notes


def run_steps(trainer: Trainer, run: Path, resume: bool, changes: list, log=print) -> Path:
    """:func:`train` once the trainer is built: resume from the newest checkpoint, then step, evaluate,
    log and checkpoint to the end; returns the run folder."""
    cfg = trainer.cfg
    if resume:
        remove_debris(run)
    run.mkdir(parents=True, exist_ok=True)
    start = resume_from_checkpoint(trainer, run, log) if resume else 0
    notes = machine_notes(trainer)
    for note in notes:
        log(note)
    saved = record_config(run, cfg, start, changes, resume, notes)
    if resume and saved is not None and saved.name != CONFIG_FILE:
        log(f"config changed on resume ({', '.join(k for k, *_ in changes)}): kept as {saved}")
    logger = MetricsLogger(
        run,
        tensorboard=cfg.log.tensorboard,
        wandb=cfg.log.wandb,
        wandb_project=cfg.log.wandb_project,
        config_dict=config_to_dict(cfg),
        progress=cfg.log.progress,
        total_steps=cfg.train.steps,
    )
    if resume:
        logger.truncate_after(start)  # steps logged after the checkpoint are redone: each step once
    try:
        for step in range(start + 1, cfg.train.steps + 1):
            with naming_nondeterministic_ops():  # train.deterministic on CUDA: an op without such a kernel, named
                metrics = train_step(trainer, step)
            release_gradients(trainer)
            if cfg.train.trim_heap:  # the step's freed heap pages, back to the kernel
                metrics[names.MEMORY_RETURNED] = returned_bytes()
            if eval_due(cfg, step):
                metrics.update(held_out_eval(trainer, step, run, log=logger.message))
            logger.log(step, metrics)
            if checkpoint_due(cfg, step):
                save_checkpoint(
                    run,
                    step,
                    trainer.learner,
                    trainer.tokenizer,
                    trainer.optimizer,
                    trainer.scheduler,
                    trainer_state(trainer),
                    keep_last=cfg.checkpoint.keep_last,
                    sampler_adapter=trainer.distill,
                )
    finally:
        logger.close()
    report = make_report(run)
    rows = read_metrics(run)
    log(run_summary(rows, run, report, latest_checkpoint(run), headline_lines(rows, cfg)))
    return run


def release_gradients(trainer: Trainer) -> None:
    """Free the learner's gradients once the step's optimizer step has used them
    (``optimizer.zero_grad(set_to_none=True)``). Left alone they stay allocated, the model's size again
    (540 MB for SmolLM2-135M in float32), through the held-out eval, the checkpoint and the next step's
    rollout and old-policy forward, until that step's update zeroes them: under ``algorithm.old_logprobs=update``
    that forward, its graph held for the loss, is the step's peak of memory. Nothing reads them between
    steps (the next update starts from zero)."""
    trainer.optimizer.zero_grad(set_to_none=True)


def trainer_state(trainer: Trainer) -> dict:
    """What a checkpoint keeps besides the weights and optimizer: the data position, the controller's state,
    the non-finite streak."""
    state = {"data": trainer.data.state_dict(), "nonfinite": trainer.nonfinite.state_dict()}
    if trainer.kv_controller is not None:
        state["kv_controller"] = trainer.kv_controller.state_dict()
    return state
