"""Checkpoints: round trip, bit-exact continuation, nothing unpickled, corrupt files named (with a
fall-back to the previous checkpoint), and a failing write (disk full) that leaves the previous one."""

import copy
import json
import pickle
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from sparserl.errors import SparserlError
from sparserl.train import checkpoint as ckpt_mod
from sparserl.train.checkpoint import (
    CheckpointError,
    CheckpointWriteError,
    NonfiniteCheckpointError,
    complete_checkpoints,
    latest_checkpoint,
    load_checkpoint,
    load_latest,
    remove_debris,
    save_checkpoint,
    set_rng_state,
)

DATA = {"epoch": 1, "position": 3, "seed": 7, "num_examples": 10, "batch_size": 2, "shuffle": True}


def fresh(tiny):
    model = copy.deepcopy(tiny.model).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 4))
    return model, opt, sched


def train_step(model, opt, sched):
    ids = torch.randint(0, 100, (2, 6)).to(model.device)  # draws from the torch RNG: continuation must restore it
    noise = random.random() + float(np.random.rand())  # ... and python's and numpy's
    loss = model(input_ids=ids).logits.float().pow(2).mean() * (1.0 + noise)
    loss.backward()
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)


def scramble_rng():
    torch.manual_seed(12345)
    random.seed(999)
    np.random.seed(4242)


def weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def save(run, step, model, opt, sched, tiny, keep_last=2):
    return save_checkpoint(run, step, model, tiny.tokenizer, opt, sched, {"data": DATA}, keep_last=keep_last)


def test_round_trip(tmp_path, tiny):
    torch.manual_seed(0)
    model, opt, sched = fresh(tiny)
    train_step(model, opt, sched)
    train_step(model, opt, sched)
    ck = save(tmp_path, 2, model, opt, sched, tiny)
    after = (torch.rand(3), random.random(), float(np.random.rand()))  # what the RNGs give right after saving
    assert sorted(p.name for p in ck.iterdir()) == [
        "COMPLETE",
        "model",
        "optimizer.json",
        "optimizer.safetensors",
        "rng.safetensors",
        "trainer.json",
    ]
    manifest = json.loads((ck / "COMPLETE").read_text())
    assert "model/model.safetensors" in manifest["files"] and "trainer.json" in manifest["files"]
    assert (tmp_path / "checkpoints" / "latest").read_text() == "step-000002"
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(ck / "model")  # the model folder stays a Hugging Face model

    scramble_rng()
    m2, o2, s2 = fresh(tiny)
    state = load_checkpoint(ck, m2, o2, s2)
    assert state["step"] == 2 and state["data"] == DATA
    for k, v in model.state_dict().items():
        assert torch.equal(v, m2.state_dict()[k]), k
    a, b = opt.state_dict(), o2.state_dict()
    assert a["param_groups"] == b["param_groups"]
    assert isinstance(b["param_groups"][0]["betas"], tuple)
    for idx, entries in a["state"].items():
        for name, v in entries.items():
            assert torch.equal(v, b["state"][idx][name]), (idx, name)
    assert s2.get_last_lr() == sched.get_last_lr() and s2.last_epoch == sched.last_epoch == 2
    sched.step()
    s2.step()
    assert s2.get_last_lr() == sched.get_last_lr()
    set_rng_state(state["rng"])
    assert torch.equal(torch.rand(3), after[0])
    assert random.random() == after[1]
    assert float(np.random.rand()) == after[2]


def test_continuation_is_bit_exact(tmp_path, tiny):
    torch.manual_seed(1)
    model, opt, sched = fresh(tiny)
    train_step(model, opt, sched)
    train_step(model, opt, sched)
    ck = save(tmp_path, 2, model, opt, sched, tiny)
    train_step(model, opt, sched)
    w3 = weights(model)

    scramble_rng()
    m2, o2, s2 = fresh(tiny)
    set_rng_state(load_checkpoint(ck, m2, o2, s2)["rng"])
    train_step(m2, o2, s2)
    for k, v in w3.items():
        assert torch.equal(v, m2.state_dict()[k]), k
    assert s2.get_last_lr() == sched.get_last_lr()


class Payload:
    """A pickle that creates a file when it is unpickled."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _rewrite_manifest(ck: Path):
    """An attacker controls the whole folder: make the manifest agree with the planted files."""
    m = json.loads((ck / "COMPLETE").read_text())
    for rel in m["files"]:
        f = ck / rel
        m["files"][rel] = {"size": f.stat().st_size, "sha256": ckpt_mod._sha256(f)}
    (ck / "COMPLETE").write_text(json.dumps(m))


def test_pickle_payloads_are_never_run(tmp_path, tiny):
    src = Path(ckpt_mod.__file__).read_text()
    assert "torch.load" not in src and "pickle" not in src

    live = tmp_path / "live-marker"
    pickle.loads(pickle.dumps(Payload(live))).close()
    assert live.exists()  # the payload is real

    marker = tmp_path / "marker"
    payload = pickle.dumps(Payload(marker))
    # 1. the old layout (optimizer.pt / trainer.pt read with torch.load): refused without reading
    old = tmp_path / "old"
    ck = old / "checkpoints" / "step-000004"
    (ck / "model").mkdir(parents=True)
    (ck / "optimizer.pt").write_bytes(payload)
    (ck / "trainer.pt").write_bytes(payload)
    (ck / "COMPLETE").write_text("4")
    (old / "checkpoints" / "latest").write_text("step-000004")
    m2, o2, s2 = fresh(tiny)
    before = weights(m2)
    with pytest.raises(CheckpointError, match="old checkpoint format.*is not read") as e:
        load_checkpoint(ck, m2, o2, s2)
    assert isinstance(e.value, SparserlError) and str(ck) in str(e.value)
    with pytest.raises(CheckpointError, match="(?s)could be loaded.*step-000004: old checkpoint format"):
        load_latest(old, m2, o2, s2, log=lambda *_: None)
    assert all(torch.equal(v, before[k]) for k, v in weights(m2).items())  # the refused file loaded nothing

    # 2. the new layout with payloads planted in its JSON and safetensors files (manifest made to agree)
    torch.manual_seed(0)
    model, opt, sched = fresh(tiny)
    train_step(model, opt, sched)
    good = save(tmp_path / "new", 1, model, opt, sched, tiny)
    for name, match in [
        ("trainer.json", "trainer.json: not readable JSON"),
        ("optimizer.json", "optimizer.json: not readable JSON"),
        ("optimizer.safetensors", "optimizer.safetensors: not a readable safetensors"),
        ("rng.safetensors", "rng.safetensors: not a readable safetensors"),
        ("model/model.safetensors", "model.safetensors: not a readable safetensors"),
    ]:
        bad = tmp_path / "planted" / name.replace("/", "_")
        shutil.copytree(good, bad)
        (bad / name).write_bytes(payload)
        _rewrite_manifest(bad)
        with pytest.raises(CheckpointError, match=match):
            load_checkpoint(bad, m2, o2, s2)
    # a planted PyTorch .bin next to the weights is simply never looked at
    (good / "model" / "pytorch_model.bin").write_bytes(payload)
    load_checkpoint(good, m2, o2, s2)
    assert not marker.exists()


@pytest.fixture(scope="module")
def two_checkpoints(tmp_path_factory, tiny):
    run = tmp_path_factory.mktemp("two") / "run"
    torch.manual_seed(0)
    model, opt, sched = fresh(tiny)
    train_step(model, opt, sched)
    save(run, 1, model, opt, sched, tiny)
    train_step(model, opt, sched)
    save(run, 2, model, opt, sched, tiny)
    return run


@pytest.mark.parametrize(
    "name", ["model/model.safetensors", "optimizer.safetensors", "trainer.json", "rng.safetensors", "optimizer.json"]
)
@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_corrupt_file_is_named_and_resume_falls_back(tmp_path, tiny, two_checkpoints, name, damage):
    run = tmp_path / "run"
    shutil.copytree(two_checkpoints, run)
    ck2 = run / "checkpoints" / "step-000002"
    f = ck2 / name
    data = f.read_bytes()
    if damage == "truncate":
        f.write_bytes(data[: len(data) // 2])
        match = rf"{f.name}: truncated or corrupt \(expected {len(data)} bytes, got {len(data) // 2}\)"
    else:
        mid = len(data) // 2
        f.write_bytes(data[:mid] + bytes([data[mid] ^ 0xFF]) + data[mid + 1 :])
        match = rf"{f.name}: truncated or corrupt \(expected sha256"
    m2, o2, s2 = fresh(tiny)
    before, opt_before, lr_before = weights(m2), copy.deepcopy(o2.state_dict()), s2.get_last_lr()
    with pytest.raises(CheckpointError, match=match) as e:
        load_checkpoint(ck2, m2, o2, s2)
    assert str(f) in str(e.value)
    # nothing was applied
    assert all(torch.equal(v, m2.state_dict()[k]) for k, v in before.items())
    assert o2.state_dict() == opt_before and s2.get_last_lr() == lr_before

    logs = []
    path, state = load_latest(run, m2, o2, s2, log=logs.append)
    assert path.name == "step-000001" and state["step"] == 1
    assert len(logs) == 1
    assert logs[0].startswith(f"checkpoint {ck2} is unreadable (") and str(f) in logs[0]
    assert logs[0].endswith(f"; falling back to {run / 'checkpoints' / 'step-000001'}")
    ref, ro, rs = fresh(tiny)
    load_checkpoint(run / "checkpoints" / "step-000001", ref, ro, rs)
    assert all(torch.equal(v, m2.state_dict()[k]) for k, v in ref.state_dict().items())


def test_no_loadable_checkpoint_names_each(tmp_path, tiny, two_checkpoints):
    run = tmp_path / "run"
    shutil.copytree(two_checkpoints, run)
    for step in (1, 2):
        f = run / "checkpoints" / f"step-00000{step}" / "trainer.json"
        f.write_text(f.read_text()[:10])
    (run / "checkpoints" / "step-000001" / "COMPLETE").write_text('{"format": 2, "fil')
    m2, o2, s2 = fresh(tiny)
    logs = []
    with pytest.raises(CheckpointError) as e:
        load_latest(run, m2, o2, s2, log=logs.append)
    msg = str(e.value)
    assert "step-000002" in msg and "trainer.json: truncated" in msg
    assert "step-000001" in msg and "COMPLETE: unreadable manifest" in msg
    assert len(logs) == 1
    assert load_latest(tmp_path / "empty", m2, o2, s2) is None


def test_a_wrong_model_is_refused_before_anything_is_applied(tmp_path, tiny, two_checkpoints):
    m2 = torch.nn.Linear(3, 3)
    o2 = torch.optim.AdamW(m2.parameters())
    before = weights(m2)
    with pytest.raises(CheckpointError, match="do not match the model"):
        load_checkpoint(two_checkpoints / "checkpoints" / "step-000002", m2, o2)
    assert all(torch.equal(v, m2.state_dict()[k]) for k, v in before.items())


@pytest.mark.parametrize("fail", ["optimizer tensors", "optimizer json", "manifest", "model", "safetensors writer"])
def test_disk_full_while_saving_keeps_the_previous_checkpoint(tmp_path, tiny, monkeypatch, fail):
    run = tmp_path / "run"
    torch.manual_seed(0)
    model, opt, sched = fresh(tiny)
    train_step(model, opt, sched)
    first = save(run, 1, model, opt, sched, tiny)
    first_files = {p.relative_to(first): p.read_bytes() for p in first.rglob("*") if p.is_file()}
    train_step(model, opt, sched)

    full = OSError(28, "No space left on device")
    if fail == "safetensors writer":  # what safetensors raises when the disk is full: not an OSError
        import safetensors.torch
        from safetensors import SafetensorError

        def save_file(tensors, path, metadata=None):
            Path(path).write_bytes(b"partial")
            raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

        monkeypatch.setattr(safetensors.torch, "save_file", save_file)
    elif fail == "model":
        real = model.save_pretrained

        def save_pretrained(folder, **kw):
            real(folder, **kw)
            f = Path(folder) / "model.safetensors"
            f.write_bytes(f.read_bytes()[:100])  # half written
            raise full

        monkeypatch.setattr(model, "save_pretrained", save_pretrained)
    else:
        target = "_save_tensors" if fail == "optimizer tensors" else "_write_json"
        real = getattr(ckpt_mod, target)
        calls = []

        def failing(obj, path):
            calls.append(path.name)
            if (
                path.name
                == {
                    "optimizer tensors": "optimizer.safetensors",
                    "optimizer json": "optimizer.json",
                    "manifest": "COMPLETE",
                }[fail]
            ):
                path.write_text("partial")
                raise full
            real(obj, path)

        monkeypatch.setattr(ckpt_mod, target, failing)
    with pytest.raises(CheckpointWriteError, match=r"checkpoint of step 2 .*No space left on device") as e:
        save(run, 2, model, opt, sched, tiny)
    assert str(first) in str(e.value) and "intact" in str(e.value)
    assert isinstance(e.value, CheckpointError)
    monkeypatch.undo()

    root = run / "checkpoints"
    assert not list(root.glob(".tmp-*")) and not (root / "step-000002").exists()
    assert (root / "latest").read_text() == "step-000001"
    assert complete_checkpoints(run) == [first] and latest_checkpoint(run) == first
    assert {p.relative_to(first): p.read_bytes() for p in first.rglob("*") if p.is_file()} == first_files
    m2, o2, s2 = fresh(tiny)
    logs = []
    path, state = load_latest(run, m2, o2, s2, log=logs.append)
    assert path == first and state["step"] == 1 and not logs


def _tree(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): p.read_bytes() if p.is_file() else None for p in folder.rglob("*")}


@pytest.mark.parametrize("where", ["weight", "optimizer state"])
def test_a_non_finite_weight_or_optimizer_state_is_never_saved(tmp_path, tiny, where):
    run = tmp_path / "run"
    torch.manual_seed(0)
    model, opt, sched = fresh(tiny)
    train_step(model, opt, sched)
    first = save(run, 1, model, opt, sched, tiny)
    before = _tree(run)
    train_step(model, opt, sched)
    name, param = next(iter(model.named_parameters()))
    with torch.no_grad():
        if where == "weight":
            param.view(-1)[3] = float("nan")
        else:
            opt.state[param]["exp_avg_sq"].view(-1)[0] = float("inf")
    with pytest.raises(NonfiniteCheckpointError) as e:
        save(run, 2, model, opt, sched, tiny)
    msg = str(e.value)
    assert isinstance(e.value, CheckpointError) and isinstance(e.value, SparserlError)
    assert "step 2" in msg and "not finite" in msg and str(first) in msg and "intact" in msg
    assert (repr(name) if where == "weight" else "'state.0.exp_avg_sq'") in msg
    assert _tree(run) == before  # nothing written: no step-000002, no debris, latest unchanged
    assert latest_checkpoint(run) == first and (run / "checkpoints" / "latest").read_text() == "step-000001"
    with pytest.raises(NonfiniteCheckpointError, match="no earlier checkpoint exists"):
        save(tmp_path / "empty", 1, model, opt, sched, tiny)
    assert not (tmp_path / "empty").exists()


def _run_without_config(tmp_path: Path) -> Path:
    """A run folder with a complete checkpoint (what resume looks for: a manifest) whose config.yaml is gone."""
    run = tmp_path / "run"
    ck = run / "checkpoints" / "step-000001"
    ck.mkdir(parents=True)
    (ck / "COMPLETE").write_text('{"format": 2, "step": 1, "files": {}}')
    (run / "metrics.jsonl").write_text('{"step": 1, "reward/mean": 0.5}\n')
    return run


def test_a_run_with_checkpoints_but_no_config_yaml_is_refused_naming_the_file(tmp_path):
    from sparserl.config import Config
    from sparserl.train.run_folder import ResumeError, check_resume_config, find_resume_folder

    run = _run_without_config(tmp_path)
    with pytest.raises(ResumeError) as e:
        check_resume_config(run, Config(name="default"))
    msg = str(e.value)
    assert "\n" not in msg and str(run / "config.yaml") in msg and "missing" in msg and "step-000001" in msg
    assert "pass the config it ran with explicitly" in msg and "--allow-config-change" in msg
    assert check_resume_config(run, Config(name="default"), allow_config_change=True) == []  # given explicitly
    # `sparserl train --resume` without a config reads the run's own: refused as the folder is found
    locator = Config(name="default")
    with pytest.raises(ResumeError, match="config.yaml is missing") as found:
        find_resume_folder(locator, run, config_from_run=True)
    assert str(found.value) == msg
    assert find_resume_folder(locator, run) == run  # a config given: check_resume_config decides
    shutil.rmtree(run / "checkpoints")
    assert check_resume_config(run, Config(name="default")) == []  # no checkpoint: a resume starts at step 0
    assert find_resume_folder(locator, run, config_from_run=True) == run


def test_sparserl_train_resume_without_config_yaml_says_so_before_loading_anything(tmp_path, capsys, monkeypatch):
    from sparserl import cli
    from sparserl.models import loading

    def no_load(*a, **k):
        raise AssertionError("a model was loaded before the missing config.yaml was named")

    monkeypatch.setattr(loading, "load_model", no_load)
    run = _run_without_config(tmp_path)
    # rollout.dtype=float32: validation does not time the sampler's dtypes (config's rollout.dtype=auto)
    code = cli.main(["train", "rollout.dtype=float32", "--resume", "--run-dir", str(run)])
    err = capsys.readouterr().err
    assert code != 0 and f"{run / 'config.yaml'} is missing" in err and "Traceback" not in err, err
    assert not (run / "config.yaml").exists()


def test_pruning_debris_and_rewriting_a_step(tmp_path, tiny):
    run = tmp_path / "run"
    torch.manual_seed(0)
    model, opt, sched = fresh(tiny)
    for step in (1, 2, 3):
        save(run, step, model, opt, sched, tiny, keep_last=2)
    assert [p.name for p in complete_checkpoints(run)] == ["step-000003", "step-000002"]
    # a resume that fell back to step 2 (step 3 unreadable) saves step 2 again and then 3: the stale
    # step 3 of the abandoned continuation goes, the rewritten step replaces the old one
    save(run, 2, model, opt, sched, tiny, keep_last=2)
    assert [p.name for p in complete_checkpoints(run)] == ["step-000002"]
    assert (run / "checkpoints" / "latest").read_text() == "step-000002"
    (run / "checkpoints" / ".tmp-step-000003-999").mkdir()
    assert latest_checkpoint(run).name == "step-000002"
    assert remove_debris(run) == 1
    save(run, 3, model, opt, sched, tiny, keep_last=0)
    assert [p.name for p in complete_checkpoints(run)] == ["step-000003", "step-000002"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_model_and_rng_round_trip(tmp_path, tiny):
    torch.manual_seed(0)
    model, opt, sched = fresh(tiny)
    model.cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    train_step(model, opt, sched)
    ck = save(tmp_path, 1, model, opt, sched, tiny)
    after = torch.rand(3, device="cuda")
    torch.cuda.manual_seed_all(77)
    m2, _, _ = fresh(tiny)
    m2.cuda()
    o2 = torch.optim.AdamW(m2.parameters(), lr=1e-3)
    s2 = torch.optim.lr_scheduler.LambdaLR(o2, lambda s: 1.0)
    state = load_checkpoint(ck, m2, o2, s2)
    assert "cuda" in state["rng"]
    set_rng_state(state["rng"])
    assert torch.equal(torch.rand(3, device="cuda"), after)
    for k, v in model.state_dict().items():
        assert torch.equal(v, m2.state_dict()[k]), k
