"""The main job's memory: what a run allocates once and no longer needs does not stay in its process.

- the ``auto`` settings' one-time measurements (the sampler's dtype, the bf16 kernel, the learner's
  precision) run in a child process (:mod:`sparserl.models.measure_apart`): their probe models and engines
  never enter the run's resident set;
- the learner's gradients are freed after each step (:func:`sparserl.train.loop.release_gradients`), not
  held through the next step's rollout and old-policy forward.
"""

from __future__ import annotations

import os

import pytest
import torch

from sparserl.models import measure_apart, mixed_precision
from sparserl.rollout import bf16_kernel_choice, dtype_choice


def test_run_apart_runs_in_a_child_and_returns_its_answer():
    assert measure_apart.run_apart(os.getpid) != os.getpid()
    assert measure_apart.run_apart(divmod, 7, 2) == (3, 1)


def test_run_apart_raises_the_childs_error():
    with pytest.raises(ZeroDivisionError):
        measure_apart.run_apart(divmod, 1, 0)


def test_run_apart_inside_the_child_runs_in_place(monkeypatch):
    monkeypatch.setattr(measure_apart, "_IN_CHILD", True)  # a measurement nested in the child's
    assert measure_apart.run_apart(os.getpid) == os.getpid()


@pytest.fixture
def apart(monkeypatch):
    """Every module's ``run_apart`` replaced by one that records the function and runs nothing."""
    calls = []

    def record(answer):
        def run_apart(fn, *args):
            calls.append((fn.__module__, fn.__name__))
            return answer

        return run_apart

    return calls, record


def test_the_sampler_dtype_is_measured_apart(apart, monkeypatch, tmp_path):
    calls, record = apart
    monkeypatch.setattr(dtype_choice, "_cache_path", lambda: tmp_path / "dtype_auto.json")
    answer = dtype_choice.AutoChoice("bfloat16", "measured", dtype_choice.machine_key(torch.device("cpu")))
    monkeypatch.setattr(dtype_choice, "run_apart", record(answer))
    assert dtype_choice.choose("cpu", log=lambda *_: None, engine=object).dtype == "bfloat16"
    assert calls == [("sparserl.rollout.dtype_choice", "measure")]
    assert dtype_choice.choose("cpu", log=lambda *_: None, engine=object).cached  # cached by the parent
    assert len(calls) == 1


def test_the_bf16_kernel_is_measured_apart(apart, monkeypatch, tmp_path):
    calls, record = apart
    monkeypatch.setattr(dtype_choice, "_cache_path", lambda: tmp_path / "dtype_auto.json")
    key = bf16_kernel_choice.cache_key(torch.device("cpu"))
    monkeypatch.setattr(
        bf16_kernel_choice, "run_apart", record(bf16_kernel_choice.KernelChoice("amx", "measured", key))
    )
    choice = bf16_kernel_choice.choose("cpu", log=lambda *_: None, kernels=("amx", "avx512_bf16"), engine=object)
    assert choice.kernel == "amx"
    assert calls == [("sparserl.rollout.bf16_kernel_choice", "measure")]


def test_the_learner_precision_is_measured_apart(apart, monkeypatch, tmp_path):
    calls, record = apart
    monkeypatch.setenv("SPARSERL_NATIVE_CACHE", str(tmp_path))
    monkeypatch.setattr(mixed_precision, "_CHOSEN", {})
    key = mixed_precision.machine_key(torch.device("cpu"))
    monkeypatch.setattr(mixed_precision, "run_apart", record(mixed_precision.PrecisionChoice("off", "measured", key)))
    assert mixed_precision.choose("cpu", log=lambda *_: None).mode == "off"
    assert calls == [("sparserl.models.mixed_precision", "measure")]


def test_a_fake_timer_still_runs_in_place(apart, monkeypatch, tmp_path):
    """Tests' fake timers are closures (not picklable): they time in this process."""
    calls, record = apart
    monkeypatch.setattr(dtype_choice, "_cache_path", lambda: tmp_path / "dtype_auto.json")
    monkeypatch.setattr(dtype_choice, "run_apart", record(None))
    choice = dtype_choice.choose("cpu", lambda name: 1.0 if name == "float32" else 2.0, log=lambda *_: None)
    assert choice.dtype == "float32" and calls == []


def test_the_learners_gradients_are_freed_after_each_step(tmp_path, monkeypatch):
    """After a step the gradients (the model's size again) are freed, not held through the next step's
    rollout and forward."""
    from test_train import cfg_for

    from sparserl.train import loop

    built, build_trainer = [], loop.build_trainer
    monkeypatch.setattr(loop, "build_trainer", lambda cfg: built.append(build_trainer(cfg)) or built[-1])
    stepped = []
    train_step = loop.train_step

    def step_and_look(trainer, step):
        out = train_step(trainer, step)
        stepped.append(sum(p.grad is not None for p in trainer.learner.parameters()))
        return out

    monkeypatch.setattr(loop, "train_step", step_and_look)
    loop.train(cfg_for(tmp_path, "train.steps=1", "checkpoint.every=0"), run_dir=tmp_path / "run", log=lambda *_: None)
    assert stepped and stepped[0] > 0  # the step's update left its gradients
    assert all(p.grad is None for p in built[0].learner.parameters())
