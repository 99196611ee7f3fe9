"""Checkpoints: tensors and JSON only (no Python object deserialization), written atomically,
checked before anything is loaded.

    RUN/checkpoints/step-000010/
        model/                  Hugging Face format (safetensors + config + tokenizer): from_pretrained loads it;
                                with LoRA (train.lora_rank) the adapter in peft's format (adapter_config.json,
                                adapter_model.safetensors): PeftModel.from_pretrained(base model, model/) loads it
        optimizer.safetensors   every tensor of the optimizer state, as ``state.<param index>.<name>``
        optimizer.json          param groups, non-tensor optimizer state, LR-scheduler state
        rng.safetensors         torch CPU RNG state (``torch``) and CUDA RNG states (``cuda.<device>``)
        trainer.json            step, data position, python and numpy RNG states
        distill_sparse/         with algorithm.distill_sparse: the sampler's φ in peft's format (adapter_config.json,
                                adapter_model.safetensors) and its optimizer (optimizer.safetensors, optimizer.json)
        COMPLETE                the manifest: size and sha256 of every file above; written last,
                                inside the temporary folder, before the rename
    RUN/checkpoints/latest   the name of the newest complete checkpoint (for people and tools; loading
                             goes by step number)

Loading reads only safetensors and JSON, so a run folder from someone else cannot run code. Every
file is checked against the manifest, then read and validated, and only then applied to the model,
optimizer and scheduler: a corrupt or truncated checkpoint raises :class:`CheckpointError` naming the
file and leaves them untouched, and :func:`load_latest` falls back to the previous complete one.

A checkpoint never holds a non-finite tensor: :func:`save_checkpoint` checks every weight and optimizer
state tensor first and refuses (:class:`NonfiniteCheckpointError`, nothing written) when one holds a NaN
or an infinity, so a resume always starts from weights that were finite.

A ``kill -9`` at any moment leaves either the previous checkpoint or the new one complete: the
temporary folder is ignored (and cleaned up by :func:`remove_debris` on resume). A failing write
(disk full) removes the temporary folder and raises :class:`CheckpointWriteError`; the previous
checkpoint and the ``latest`` pointer stay as they were.

A folder holding ``optimizer.pt``/``trainer.pt`` (files only Python object deserialization can read) is
refused, not read.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import SparserlError
from ..models.invariant_scaling import applied_scale, unscaled_state_dict
from .lora import ADAPTER_WEIGHTS, adapter_state, has_lora, load_adapter, save_adapter
from .nonfinite import LIKELY_CAUSES, first_nonfinite

__all__ = [
    "CheckpointError",
    "CheckpointWriteError",
    "FORMAT",
    "NonfiniteCheckpointError",
    "complete_checkpoints",
    "latest_checkpoint",
    "load_checkpoint",
    "load_latest",
    "remove_debris",
    "rng_state",
    "save_checkpoint",
    "set_rng_state",
]

FORMAT = 2
DISTILL_DIR = "distill_sparse"  # DistillSparse's φ and its optimizer (sparserl.train.distill_sparse)
MANIFEST = "COMPLETE"
_STEP_DIR = re.compile(r"^step-(\d+)$")
_OLD_FILES = ("optimizer.pt", "trainer.pt")


class CheckpointError(SparserlError):
    """A checkpoint that cannot be read; the message names the file and what is wrong with it."""


class CheckpointWriteError(CheckpointError):
    """A checkpoint that could not be written (disk full, I/O error). The previous one is intact."""


class NonfiniteCheckpointError(CheckpointError):
    """A checkpoint refused because a weight or an optimizer state tensor holds a NaN or an infinity; the
    message names the first such tensor. Nothing was written; the previous checkpoint is intact."""


# ----------------------------------------------------------------------------------------- helpers


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _is_io_error(e: BaseException) -> bool:
    """safetensors' writer reports a failed write (disk full) as a ``SafetensorError`` "... I/O error: ...", not an
    ``OSError``; model.save_pretrained writes through it too."""
    from safetensors import SafetensorError

    return isinstance(e, SafetensorError) and "I/O error" in str(e)


def _save_tensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """Write tensors as safetensors (a module-level function so tests can inject a failure)."""
    from safetensors.torch import save_file

    save_file({k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}, str(path))


def _write_json(obj: Any, path: Path) -> None:
    """Write JSON (a module-level function so tests can inject a failure)."""
    text = json.dumps(obj, indent=1, allow_nan=True)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)


def _encode(value: Any, where: str) -> Any:
    """A JSON-able copy of ``value``; tuples are tagged so they come back as tuples."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    if isinstance(value, tuple):
        return {"__tuple__": [_encode(v, where) for v in value]}
    if isinstance(value, list):
        return [_encode(v, where) for v in value]
    if isinstance(value, dict):
        if any(not isinstance(k, str) for k in value):
            raise TypeError(f"{where}: dict keys must be strings, got {list(value)[:5]}")
        if "__tuple__" in value:
            raise TypeError(f"{where}: the key '__tuple__' is reserved")
        return {k: _encode(v, f"{where}.{k}") for k, v in value.items()}
    raise TypeError(f"{where}: {type(value).__name__} cannot be saved as JSON")


def _decode(value: Any) -> Any:
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if isinstance(value, dict):
        if set(value) == {"__tuple__"}:
            return tuple(_decode(v) for v in value["__tuple__"])
        return {k: _decode(v) for k, v in value.items()}
    return value


def _jsonable(value: Any) -> bool:
    try:
        _encode(value, "")
        return True
    except TypeError:
        return False


def _step_of(path: Path) -> int | None:
    m = _STEP_DIR.match(path.name)
    return int(m.group(1)) if m else None


# ------------------------------------------------------------------------------------------- RNG


def rng_state() -> dict:
    """All RNG states: torch CPU, CUDA (when available), python ``random``, numpy."""
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore what :func:`rng_state` (or ``load_checkpoint(...)["rng"]``) holds."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    cuda = state.get("cuda")
    if cuda and torch.cuda.is_available():
        n = min(len(cuda), torch.cuda.device_count())
        for i in range(n):
            torch.cuda.set_rng_state(cuda[i], i)


def _rng_to_files(state: dict) -> tuple[dict[str, torch.Tensor], dict]:
    tensors = {"torch": state["torch"]}
    for i, t in enumerate(state.get("cuda") or []):
        tensors[f"cuda.{i}"] = t
    version, internal, gauss = state["python"]
    kind, keys, pos, has_gauss, cached = state["numpy"][:5]
    meta = {
        "python": {"version": int(version), "state": [int(x) for x in internal], "gauss": gauss},
        "numpy": {
            "kind": str(kind),
            "keys": [int(x) for x in np.asarray(keys).tolist()],
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
    }
    return tensors, meta


def _rng_from_files(tensors: dict[str, torch.Tensor], meta: Any, path: Path) -> dict:
    """Rebuild and validate the RNG states (on throw-away generators; nothing global is touched)."""
    try:
        py = meta["python"]
        python = (
            int(py["version"]),
            tuple(int(x) for x in py["state"]),
            None if py["gauss"] is None else float(py["gauss"]),
        )
        random.Random().setstate(python)
        nm = meta["numpy"]
        numpy_state = (
            str(nm["kind"]),
            np.asarray(nm["keys"], dtype=np.uint32),
            int(nm["pos"]),
            int(nm["has_gauss"]),
            float(nm["cached_gaussian"]),
        )
        np.random.RandomState().set_state(numpy_state)
    except Exception as e:  # any malformed entry is a corrupt file
        raise CheckpointError(f"{path / 'trainer.json'}: bad RNG state ({type(e).__name__}: {e})") from None
    where = path / "rng.safetensors"
    t = tensors.get("torch")
    if t is None or t.dtype != torch.uint8 or t.dim() != 1:
        raise CheckpointError(f"{where}: no torch RNG state (a 1-d uint8 tensor named 'torch')")
    try:
        torch.Generator().set_state(t)
    except Exception as e:
        raise CheckpointError(f"{where}: bad torch RNG state ({e})") from None
    cuda = []
    while f"cuda.{len(cuda)}" in tensors:
        cuda.append(tensors[f"cuda.{len(cuda)}"])
    state = {"torch": t, "python": python, "numpy": numpy_state}
    if cuda:
        state["cuda"] = cuda
    return state


# ------------------------------------------------------------------------------------------ save


def _optimizer_to_files(optimizer, scheduler) -> tuple[dict[str, torch.Tensor], dict]:
    sd = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict] = {}
    for idx, entries in sd["state"].items():
        for name, value in entries.items():
            if "." in str(name):
                raise TypeError(f"optimizer state name {name!r} contains a '.'")
            if isinstance(value, torch.Tensor):
                tensors[f"state.{idx}.{name}"] = value
            else:
                scalars.setdefault(str(idx), {})[str(name)] = _encode(value, f"optimizer.state.{idx}.{name}")
    groups = []
    for gi, group in enumerate(sd["param_groups"]):
        g = {}
        for key, value in group.items():
            if isinstance(value, torch.Tensor):  # e.g. a tensor lr
                tensors[f"group.{gi}.{key}"] = value
                g[key] = {"__tensor__": f"group.{gi}.{key}"}
            else:
                g[key] = _encode(value, f"optimizer.param_groups.{gi}.{key}")
        groups.append(g)
    meta = {"param_groups": groups, "state": scalars, "param_indices": [str(i) for i in sd["state"]], "scheduler": None}
    if scheduler is not None:
        ssd = scheduler.state_dict()
        kept = {}
        for key, value in ssd.items():
            if key == "lr_lambdas" and isinstance(value, list):  # lambdas are code: keep only their data
                kept[key] = [
                    _encode(v, "scheduler.lr_lambdas") if v is not None and _jsonable(v) else None for v in value
                ]
            elif _jsonable(value):
                kept[key] = _encode(value, f"scheduler.{key}")
        meta["scheduler"] = kept
    return tensors, meta


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    model,
    tokenizer,
    optimizer,
    scheduler,
    trainer_state: dict,
    keep_last: int = 2,
    sampler_adapter=None,
) -> Path:
    """Write ``RUN/checkpoints/step-<step>`` atomically and point ``latest`` at it; keep the last
    ``keep_last`` complete checkpoints (0: all). ``sampler_adapter``: DistillSparse's φ (an object with the
    peft-adapted ``model`` and its ``optimizer``), saved in ``distill_sparse/``.
    Checkpoints of a later step than ``step`` belong to
    an abandoned continuation (a resume fell back past them) and are removed.

    Raises :class:`NonfiniteCheckpointError` before writing anything when a weight or optimizer state
    tensor (the model's, and φ's with ``sampler_adapter``) is not finite, and
    :class:`CheckpointWriteError` when a write fails (``OSError``: disk full, I/O error); the
    temporary folder is removed and the previous checkpoint and ``latest`` are left as they were."""
    root = Path(run_dir) / "checkpoints"
    name = f"step-{step:06d}"
    final = root / name
    tmp = root / f".tmp-{name}-{os.getpid()}"
    # Everything that can fail for a programming reason (state not JSON-able) fails before any write.
    opt_tensors, opt_meta = _optimizer_to_files(optimizer, scheduler)
    checked = {
        "model weight": adapter_state(model) if has_lora(model) else model.state_dict(),
        "optimizer state": opt_tensors,
    }
    if sampler_adapter is not None:
        phi_opt_tensors, phi_opt_meta = _optimizer_to_files(sampler_adapter.optimizer, None)
        checked.update(
            {
                "DistillSparse φ weight": adapter_state(sampler_adapter.model),
                "DistillSparse φ optimizer state": phi_opt_tensors,
            }
        )
    _refuse_nonfinite(checked, step, root)
    rng_tensors, rng_meta = _rng_to_files(rng_state())
    trainer_meta = {
        "format": FORMAT,
        **_encode(dict(trainer_state), "trainer_state"),
        "step": int(step),
        "rng": rng_meta,
    }
    try:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        scaled = applied_scale(model) != 1.0  # QuRL's invariant scaling: save the original form
        if has_lora(model):  # the adapter alone, in peft's format (the base weights are model.name's)
            save_adapter(model, tmp / "model", _save_tensors)
        else:
            model.save_pretrained(
                tmp / "model", safe_serialization=True, **({"state_dict": unscaled_state_dict(model)} if scaled else {})
            )
        tokenizer.save_pretrained(tmp / "model")
        _save_tensors(opt_tensors, tmp / "optimizer.safetensors")
        if sampler_adapter is not None:
            save_adapter(sampler_adapter.model, tmp / DISTILL_DIR, _save_tensors)
            _save_tensors(phi_opt_tensors, tmp / DISTILL_DIR / "optimizer.safetensors")
            _write_json(phi_opt_meta, tmp / DISTILL_DIR / "optimizer.json")
        _write_json(opt_meta, tmp / "optimizer.json")
        _save_tensors(rng_tensors, tmp / "rng.safetensors")
        _write_json(trainer_meta, tmp / "trainer.json")
        files = {}
        for f in sorted(tmp.rglob("*")):
            if f.is_file():
                with open(f, "rb+") as fh:
                    os.fsync(fh.fileno())
                files[f.relative_to(tmp).as_posix()] = {"size": f.stat().st_size, "sha256": _sha256(f)}
        for d in sorted({f.parent for f in tmp.rglob("*")}, key=lambda p: -len(p.parts)):
            _fsync_dir(d)
        _write_json({"format": FORMAT, "step": int(step), "files": files}, tmp / MANIFEST)
        with open(tmp / MANIFEST, "rb+") as fh:
            os.fsync(fh.fileno())
        _fsync_dir(tmp)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError) or _is_io_error(e):
            raise CheckpointWriteError(_write_failed(step, tmp, e, root)) from e
        raise
    old = None
    try:
        if final.exists():  # the same step written again (after a resume): move it aside, never delete first
            old = root / f".tmp-old-{name}-{os.getpid()}"
            os.replace(final, old)
        os.replace(tmp, final)
        _fsync_dir(root)
    except OSError as e:
        if old is not None and not final.exists():
            try:
                os.replace(old, final)
                old = None
            except OSError:
                pass
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointWriteError(_write_failed(step, final, e, root)) from e
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    try:
        pointer_tmp = root / ".latest.tmp"
        with open(pointer_tmp, "w") as fh:
            fh.write(name)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(pointer_tmp, root / "latest")
        _fsync_dir(root)
    except OSError as e:
        try:
            pointer_tmp.unlink(missing_ok=True)
        except OSError:
            pass
        raise CheckpointWriteError(
            f"checkpoint {final} (step {step}) is complete, but the pointer {root / 'latest'} could not be "
            f"updated ({e}); resume still finds {final}"
        ) from e
    for p in complete_checkpoints(run_dir):
        s = _step_of(p)
        if s is not None and s > step:
            shutil.rmtree(p, ignore_errors=True)
    if keep_last and keep_last > 0:
        done = [p for p in complete_checkpoints(run_dir) if (_step_of(p) or 0) <= step]
        for p in done[keep_last:]:
            shutil.rmtree(p, ignore_errors=True)
    return final


def _refuse_nonfinite(checked: dict[str, Any], step: int, root: Path) -> None:
    """Raise :class:`NonfiniteCheckpointError` naming the first tensor of ``checked`` ({what: tensors}) that is
    not finite."""
    for what, tensors in checked.items():
        name = first_nonfinite(tensors)
        if name is not None:
            prev = next(iter(complete_checkpoints(root.parent)), None)
            keep = f"the previous checkpoint {prev} is intact" if prev else "no earlier checkpoint exists"
            raise NonfiniteCheckpointError(
                f"refusing to save the checkpoint of step {step}: {what} {name!r} is not finite (NaN or inf); "
                f"nothing was written, {keep}. Likely causes: {'; '.join(LIKELY_CAUSES)}"
            )


def _write_failed(step: int, where: Path, e: OSError, root: Path) -> str:
    prev = next(iter(complete_checkpoints(root.parent)), None)
    keep = f"the previous checkpoint {prev} is intact" if prev else "no earlier checkpoint exists"
    return f"could not write the checkpoint of step {step} ({where}): {e}; {keep}"


# ------------------------------------------------------------------------------------------ find


def complete_checkpoints(run_dir: str | Path) -> list[Path]:
    """The complete checkpoints of a run (those with a manifest), newest (highest step) first."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    done = [(s, p) for p in root.iterdir() if (s := _step_of(p)) is not None and (p / MANIFEST).is_file()]
    return [p for _, p in sorted(done, reverse=True)]


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint of a run (None when there is none)."""
    done = complete_checkpoints(run_dir)
    return done[0] if done else None


def remove_debris(run_dir: str | Path) -> int:
    """Delete the temporary folders of a run killed while saving (call only when no process writes
    to this run, i.e. on resume). Returns how many were removed."""
    root = Path(run_dir) / "checkpoints"
    debris = list(root.glob(".tmp-*")) if root.exists() else []
    for tmp in debris:
        shutil.rmtree(tmp, ignore_errors=True)
    if root.exists() and (root / ".latest.tmp").exists():
        (root / ".latest.tmp").unlink()
    return len(debris)


# ------------------------------------------------------------------------------------------ load


def _read_manifest(path: Path) -> dict[str, dict]:
    where = path / MANIFEST
    if not where.is_file():
        raise CheckpointError(f"{where}: missing (the checkpoint is incomplete)")
    try:
        manifest = json.loads(where.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise CheckpointError(f"{where}: unreadable manifest ({e})") from None
    if not isinstance(manifest, dict):
        if any((path / f).exists() for f in _OLD_FILES):
            raise CheckpointError(
                f"{path}: old checkpoint format ({', '.join(_OLD_FILES)}) is not read: loading it "
                f"would deserialize Python objects, which can run any code put in it. Its weights in "
                f"{path / 'model'} still load with from_pretrained (model.name={path / 'model'}); "
                f"start a new run from them"
            )
        raise CheckpointError(f"{where}: not a checkpoint manifest (expected a JSON object)")
    if manifest.get("format") != FORMAT:
        raise CheckpointError(
            f"{where}: checkpoint format {manifest.get('format')!r}, this sparserl reads format {FORMAT}"
        )
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        raise CheckpointError(f"{where}: the manifest lists no files")
    for rel, info in files.items():
        parts = Path(rel).parts
        if Path(rel).is_absolute() or ".." in parts or not isinstance(info, dict):
            raise CheckpointError(f"{where}: bad entry {rel!r}")
    for needed in ("optimizer.safetensors", "optimizer.json", "rng.safetensors", "trainer.json"):
        if needed not in files:
            raise CheckpointError(f"{where}: the manifest does not list {needed}")
    if not any(r.startswith("model/") and r.endswith(".safetensors") for r in files):
        raise CheckpointError(f"{where}: the manifest lists no model/*.safetensors")
    return files


def _verify(path: Path, files: dict[str, dict]) -> None:
    for rel, info in files.items():
        f = path / rel
        if not f.is_file():
            raise CheckpointError(f"{f}: missing (listed in {path / MANIFEST})")
        size = f.stat().st_size
        if size != info.get("size"):
            raise CheckpointError(f"{f}: truncated or corrupt (expected {info.get('size')} bytes, got {size})")
        digest = _sha256(f)
        if digest != info.get("sha256"):
            raise CheckpointError(f"{f}: truncated or corrupt (expected sha256 {info.get('sha256')}, got {digest})")


def _load_tensors(f: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    try:
        return load_file(str(f))
    except Exception as e:  # safetensors raises its own error types
        raise CheckpointError(f"{f}: not a readable safetensors file ({type(e).__name__}: {e})") from None


def _load_json(f: Path) -> Any:
    try:
        return json.loads(f.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise CheckpointError(f"{f}: not readable JSON ({e})") from None


def _optimizer_from_files(tensors: dict[str, torch.Tensor], meta: Any, path: Path, optimizer) -> dict:
    where_j, where_t = path / "optimizer.json", path / "optimizer.safetensors"
    if not isinstance(meta, dict) or not isinstance(meta.get("param_groups"), list):
        raise CheckpointError(f"{where_j}: no param_groups")
    groups = []
    for gi, g in enumerate(meta["param_groups"]):
        if not isinstance(g, dict) or not isinstance(g.get("params"), list):
            raise CheckpointError(f"{where_j}: param group {gi} is malformed")
        group = {}
        for key, value in g.items():
            if isinstance(value, dict) and set(value) == {"__tensor__"}:
                if value["__tensor__"] not in tensors:
                    raise CheckpointError(f"{where_t}: missing tensor {value['__tensor__']}")
                group[key] = tensors[value["__tensor__"]]
            else:
                group[key] = _decode(value)
        groups.append(group)
    state: dict[int, dict] = {}
    for key, t in tensors.items():
        parts = key.split(".")
        if parts[0] == "group":
            continue
        if len(parts) != 3 or parts[0] != "state" or not parts[1].isdigit():
            raise CheckpointError(f"{where_t}: unexpected tensor {key!r}")
        state.setdefault(int(parts[1]), {})[parts[2]] = t
    for idx, entries in (meta.get("state") or {}).items():
        if not str(idx).isdigit() or not isinstance(entries, dict):
            raise CheckpointError(f"{where_j}: bad state entry {idx!r}")
        state.setdefault(int(idx), {}).update({k: _decode(v) for k, v in entries.items()})
    if optimizer is not None:
        current = optimizer.state_dict()["param_groups"]
        if len(current) != len(groups) or any(len(a["params"]) != len(b["params"]) for a, b in zip(current, groups)):
            raise CheckpointError(
                f"{where_j}: the optimizer state is for param groups of sizes "
                f"{[len(g['params']) for g in groups]}, this optimizer has {[len(g['params']) for g in current]}"
            )
    sched = meta.get("scheduler")
    if sched is not None and not isinstance(sched, dict):
        raise CheckpointError(f"{where_j}: scheduler state is not an object")
    return {
        "optimizer": {"state": state, "param_groups": groups},
        "scheduler": None if sched is None else _decode(sched),
    }


def _restore_scheduler(scheduler, saved: dict) -> None:
    current = scheduler.state_dict()
    merged = {**current, **saved}
    if isinstance(current.get("lr_lambdas"), list):
        # lambdas are code and are not saved: keep this scheduler's, apply only their saved data
        lams = saved.get("lr_lambdas") or []
        merged["lr_lambdas"] = [
            lams[i] if i < len(lams) and isinstance(lams[i], dict) else None for i in range(len(current["lr_lambdas"]))
        ]
    scheduler.load_state_dict(merged)


def load_checkpoint(path: str | Path, model, optimizer=None, scheduler=None, sampler_adapter=None) -> dict:
    """Load weights (and optimizer and scheduler state) in place; return the trainer state:
    ``{"step": int, "data": <PromptSampler state>, "rng": <for set_rng_state>, ...}``.

    Every file is checked against the manifest and read before anything is applied: on a
    :class:`CheckpointError` the model, optimizer and scheduler are unchanged. ``sampler_adapter``:
    DistillSparse's φ and its optimizer, loaded from ``distill_sparse/``."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: no such checkpoint folder")
    files = _read_manifest(path)
    _verify(path, files)
    # read
    weights: dict[str, torch.Tensor] = {}
    for rel in sorted(files):
        if rel.startswith("model/") and rel.endswith(".safetensors"):
            weights.update(_load_tensors(path / rel))
    # validate the weights against the model (with LoRA: against its adapter)
    lora = has_lora(model)
    tied = not lora and bool(getattr(getattr(model, "config", None), "tie_word_embeddings", False))
    expected = adapter_state(model) if lora else model.state_dict()
    missing = [k for k in expected if k not in weights and not (k == "lm_head.weight" and tied)]
    unexpected = [k for k in weights if k not in expected]
    if missing or unexpected:
        raise CheckpointError(
            f"{path / 'model'}: the weights do not match the model (missing {missing[:5]}, unexpected {unexpected[:5]})"
        )
    for k, t in weights.items():
        if t.shape != expected[k].shape:
            raise CheckpointError(
                f"{path / 'model'}: {k} has shape {tuple(t.shape)}, the model has {tuple(expected[k].shape)}"
            )
    trainer = _load_json(path / "trainer.json")
    if not isinstance(trainer, dict) or not isinstance(trainer.get("step"), int) or "rng" not in trainer:
        raise CheckpointError(f"{path / 'trainer.json'}: no step and RNG state")
    rng = _rng_from_files(_load_tensors(path / "rng.safetensors"), trainer["rng"], path)
    opt = None
    if optimizer is not None or scheduler is not None:
        opt = _optimizer_from_files(
            _load_tensors(path / "optimizer.safetensors"), _load_json(path / "optimizer.json"), path, optimizer
        )
        if scheduler is not None and opt["scheduler"] is None:
            raise CheckpointError(f"{path / 'optimizer.json'}: no scheduler state")
    phi = _read_sampler_adapter(path, files, sampler_adapter) if sampler_adapter is not None else None
    # apply
    if phi is not None:
        load_adapter(sampler_adapter.model, phi[0])
        sampler_adapter.optimizer.load_state_dict(phi[1])
    if lora:
        load_adapter(model, weights)
    else:
        model.load_state_dict(weights, strict=False)
    if tied and hasattr(model, "tie_weights"):
        model.tie_weights()
    if optimizer is not None:
        optimizer.load_state_dict(opt["optimizer"])
    if scheduler is not None:
        _restore_scheduler(scheduler, opt["scheduler"])
    out = {k: _decode(v) for k, v in trainer.items() if k not in ("format", "rng")}
    out["rng"] = rng
    return out


def _read_sampler_adapter(path: Path, files: dict, sampler_adapter) -> tuple[dict, dict]:
    """(φ's tensors, its optimizer's state) from ``distill_sparse/``, checked against ``sampler_adapter``."""
    folder = path / DISTILL_DIR
    if f"{DISTILL_DIR}/{ADAPTER_WEIGHTS}" not in files:
        raise CheckpointError(
            f"{folder}: no DistillSparse adapter ({ADAPTER_WEIGHTS}); the run was saved without "
            "algorithm.distill_sparse"
        )
    weights = _load_tensors(folder / ADAPTER_WEIGHTS)
    expected = adapter_state(sampler_adapter.model)
    if set(weights) != set(expected) or any(weights[k].shape != expected[k].shape for k in expected):
        raise CheckpointError(
            f"{folder / ADAPTER_WEIGHTS}: the adapter does not match algorithm.distill_sparse "
            f"(rank, target): {len(weights)} tensors, expected {len(expected)} of the configured shapes"
        )
    opt = _optimizer_from_files(
        _load_tensors(folder / "optimizer.safetensors"),
        _load_json(folder / "optimizer.json"),
        folder,
        sampler_adapter.optimizer,
    )
    return weights, opt["optimizer"]


def load_latest(
    run_dir: str | Path, model, optimizer=None, scheduler=None, log: Callable[[str], Any] = print, sampler_adapter=None
) -> tuple[Path, dict] | None:
    """Load the newest complete checkpoint of a run that reads; on a :class:`CheckpointError` log
    ``checkpoint <path> is unreadable (<reason>); falling back to <older>`` and try the previous one.

    Returns ``(path, trainer state)``, or None when the run has no complete checkpoint; raises
    :class:`CheckpointError` naming each one tried when none loads."""
    candidates = complete_checkpoints(run_dir)
    if not candidates:
        return None
    failures = []
    for i, ck in enumerate(candidates):
        try:
            return ck, load_checkpoint(ck, model, optimizer, scheduler, sampler_adapter)
        except CheckpointError as e:
            failures.append(str(e))  # each message starts with the file it is about
            if i + 1 < len(candidates):
                log(f"checkpoint {ck} is unreadable ({e}); falling back to {candidates[i + 1]}")
    raise CheckpointError(
        f"no checkpoint of {Path(run_dir)} could be loaded (remove {Path(run_dir) / 'checkpoints'} "
        f"to start over):\n  " + "\n  ".join(failures)
    )
