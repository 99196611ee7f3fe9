"""Freed heap pages handed back to the kernel (:mod:`sparserl.memory.allocator`): a freed tensor of a few MiB
between live ones stays resident under glibc's own thresholds until ``malloc_trim``; a training step trims where
its phases' transients have been freed and logs what the step's end returned."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sparserl import runlog as names

CHILD = """
import json, torch
from sparserl.memory.allocator import resident_bytes, returned_bytes
x = torch.ones(1 << 21); del x  # 8 MiB mapped and freed: glibc's dynamic mmap threshold rises to it
blocks, live = [], []
for i in range(64):
    blocks.append(torch.ones(3 << 18))  # 3 MiB each, from the heap now
    live.append(torch.ones(3 << 17))  # 1.5 MiB each, still in use between them
before = resident_bytes()
del blocks
freed = before - resident_bytes()
print(json.dumps({"freed": freed / 2**20, "returned": returned_bytes() / 2**20}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim and /proc")
def test_freed_tensors_between_live_ones_go_back_to_the_kernel_only_when_trimmed():
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    mib = json.loads(out.stdout.strip().splitlines()[-1])
    assert mib["freed"] <= 0.25 * 192, mib  # glibc alone keeps the heap's holes resident
    assert mib["returned"] >= 0.9 * 192, mib  # the 64 holes of 3 MiB, given back by the trim


@pytest.mark.parametrize("trim_heap", [True, False])
def test_a_step_trims_after_the_rollout_before_the_update_after_each_micro_batch_and_at_its_end(
    tmp_path, monkeypatch, trim_heap
):
    """``train.trim_heap`` (default true) trims at those four places; false trims nowhere and logs no return."""
    from test_train import cfg_for

    from sparserl.train import loop, step, update

    calls = []
    monkeypatch.setattr(step, "trim_freed_memory", lambda: calls.append("station") or True)
    monkeypatch.setattr(update, "trim_freed_memory", lambda: calls.append("micro-batch") or True)
    monkeypatch.setattr(loop, "returned_bytes", lambda: calls.append("step end") or 12345)
    config = cfg_for(
        tmp_path, "train.steps=2", "checkpoint.every=0", "train.micro_batch_size=2", f"train.trim_heap={trim_heap}"
    )
    run = loop.train(config, run_dir=tmp_path / "run", log=lambda *_: None)
    rows = [json.loads(line) for line in (run / names.METRICS_FILE).read_text().splitlines()]
    if not trim_heap:
        assert calls == [] and all(names.MEMORY_RETURNED not in r for r in rows)
        return
    one_step = ["station", "station", *["micro-batch"] * (config.train.prompts_per_step * config.rollout.n // 2)]
    assert calls == [*one_step, "step end"] * 2
    assert [r[names.MEMORY_RETURNED] for r in rows] == [12345, 12345]
