"""Every Triton kernel of the GPU sampler compiles for sm_90 (H100 / H200) on this CPU machine, and none spills:
the registers, stack, local memory and spill bytes read from the compiled code (``sparserl.rollout.gpu.resources``:
the cuobjdump and ptxas that Triton's wheel bundles). In a child process: Triton's interpreter, which the test
session turns on, replaces the kernels when they are imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton", reason="Triton is the gpu extra, installed by install.sh")

PROGRAM = """
import json
from dataclasses import asdict
from sparserl.rollout.gpu.resources import compile_for, kernel_variants, resource_report
print(json.dumps({name: asdict(resource_report(compile_for(*v))) for name, v in kernel_variants().items()}))
"""


def test_every_kernel_compiles_for_sm90_without_spilling(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-cache")  # compile here, not from a previous run's cache
    done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert {"decode_attention g3 d64 bf16", "decode_attention g6 d128 int8", "page_attention g6 d128 bf16 k8x16",
            "rkv_redundancy d128 bf16"} <= set(report)  # fmt: skip
    for name, r in report.items():
        assert r["registers"] > 0, name  # the report was read, not defaulted
        assert r["spill_stores"] == 0 and r["spill_loads"] == 0 and r["local_bytes"] == 0, (name, r)
        assert r["registers"] <= 255, (name, r)
