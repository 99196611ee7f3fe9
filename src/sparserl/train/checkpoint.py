"""Checkpoints written atomically: a temporary folder, fsync, rename, then the ``latest`` pointer.

    RUN/checkpoints/step-000010/
        model/          Hugging Face format (safetensors + config + tokenizer): from_pretrained loads it
        optimizer.pt    optimizer and LR-scheduler state
        trainer.pt      step, data position, RNG states
        COMPLETE        written last, inside the temporary folder, before the rename
    RUN/checkpoints/latest   the name of the newest complete checkpoint

A ``kill -9`` at any moment leaves either the previous checkpoint or the new one complete: the
temporary folder is ignored (and cleaned up) on resume.
"""
from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])


def save_checkpoint(run_dir: str | Path, step: int, model, tokenizer, optimizer, scheduler, trainer_state: dict,
                    keep_last: int = 2) -> Path:
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    name = f"step-{step:06d}"
    final = root / name
    tmp = root / f".tmp-{name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    model.save_pretrained(tmp / "model", safe_serialization=True)
    tokenizer.save_pretrained(tmp / "model")
    torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}, tmp / "optimizer.pt")
    torch.save({**trainer_state, "step": step, "rng": rng_state()}, tmp / "trainer.pt")
    for f in tmp.rglob("*"):
        if f.is_file():
            with open(f, "rb+") as fh:
                os.fsync(fh.fileno())
    (tmp / "COMPLETE").write_text(str(step))
    _fsync_dir(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(root)
    pointer_tmp = root / ".latest.tmp"
    pointer_tmp.write_text(name)
    os.replace(pointer_tmp, root / "latest")
    _fsync_dir(root)
    if keep_last and keep_last > 0:
        done = sorted(p for p in root.glob("step-*") if (p / "COMPLETE").exists())
        for old in done[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint of a run (None when there is none)."""
    root = Path(run_dir) / "checkpoints"
    if not root.exists():
        return None
    pointer = root / "latest"
    if pointer.exists():
        cand = root / pointer.read_text().strip()
        if (cand / "COMPLETE").exists():
            return cand
    done = sorted(p for p in root.glob("step-*") if (p / "COMPLETE").exists())
    return done[-1] if done else None


def remove_debris(run_dir: str | Path) -> int:
    """Delete the temporary folders of a run killed while saving (call only when no process writes
    to this run, i.e. on resume). Returns how many were removed."""
    root = Path(run_dir) / "checkpoints"
    debris = list(root.glob(".tmp-*")) if root.exists() else []
    for tmp in debris:
        shutil.rmtree(tmp, ignore_errors=True)
    return len(debris)


def load_checkpoint(path: str | Path, model, optimizer=None, scheduler=None) -> dict:
    """Load weights (and optimizer state) in place; return the trainer state (step, data, RNG)."""
    from safetensors.torch import load_file

    path = Path(path)
    state = {}
    for f in sorted((path / "model").glob("*.safetensors")):
        state.update(load_file(str(f)))
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and getattr(model.config, "tie_word_embeddings", False))]
    if missing or unexpected:
        raise ValueError(f"{path}: checkpoint does not match the model (missing {missing[:5]}, unexpected {unexpected[:5]})")
    if getattr(model.config, "tie_word_embeddings", False):
        model.tie_weights()
    if optimizer is not None:
        opt = torch.load(path / "optimizer.pt", weights_only=False)
        optimizer.load_state_dict(opt["optimizer"])
        if scheduler is not None:
            scheduler.load_state_dict(opt["scheduler"])
    return torch.load(path / "trainer.pt", weights_only=False)
