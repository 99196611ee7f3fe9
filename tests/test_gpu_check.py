"""The GPU check (``experiments/device/gpu_check.sh``) keeps working: its smoke mode runs here, on the CPU in
Triton's interpreter, and reports each kernel's error against float64, a timing row per case, and the static
decode step's tokens against the eager engine's."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="Triton is the gpu extra, installed by install.sh")
ROOT = Path(__file__).resolve().parents[1]


def test_the_gpu_check_runs_in_smoke_mode(tmp_path):
    env = {**os.environ, "SMOKE": "1", "OUT": str(tmp_path)}
    done = subprocess.run(
        ["bash", "experiments/device/gpu_check.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "gpu_kernels.json").read_text())
    errors = report["max_abs_error_vs_reference"]
    assert set(errors) == {
        "decode_attention", "page_attention", "decode_attention_int8", "rkv_redundancy", "window_scores"
    }  # fmt: skip
    assert all(e < 1e-5 for e in errors.values()), errors
    cases = [r["case"] for r in report["decode_attention_batch"]]
    assert any(c.startswith("dense") for c in cases) and any("block top-k" in c for c in cases)
    assert all(r["kernel_s"] > 0 and r["eager_s"] > 0 for r in report["decode_attention_batch"])
    assert "vs eager" in done.stdout
    static = report["static_step"]
    names = [r["compressor"] for r in static["compressors"]]
    assert names == ["none", "rkv", "snapkv", "streaming", "h2o", "blocktopk"]
    assert all(
        r["greedy_tokens_identical"] and r["greedy_tokens_identical_refilled"] and r["max_logprob_gap"] < 1e-4
        for r in static["compressors"]
    ), static
    assert static["seconds_per_token"]["static"] > 0
