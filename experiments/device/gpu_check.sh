#!/usr/bin/env bash
# The GPU sampler's check, one call on a lent GPU machine (run from the repository root; ≤ 8 minutes):
#   1. every Triton kernel of sparserl.rollout.gpu compiled for this GPU and checked against float64;
#   2. decode attention at batch 256 with SmolLM2-135M's shapes: the kernel against the eager engine and against
#      the copy ceiling (dense 1,024 / 4,096, R-KV's bounded cache, block top-k's pages);
#   3. the kernels' registers and spills as compiled for sm_90 (the same report the CPU test reads).
#   OUT=dir bash experiments/device/gpu_check.sh               # on the GPU machine
#   SMOKE=1 OUT=/tmp/gc bash experiments/device/gpu_check.sh   # here: tiny shapes in Triton's interpreter (tests run it)
set -uo pipefail
OUT=${OUT:-/tmp/gpu_check}; SMOKE=${SMOKE:-0}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
echo "=== machine ($(date +%T))"
nvidia-smi -L 2>/dev/null; grep -m1 'model name' /proc/cpuinfo; nproc
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
echo "=== kernels ($(date +%T))"
if [ "$SMOKE" = 1 ]; then
  timeout 300 python3 experiments/device/gpu_engine_check.py --smoke --out "$OUT" 2>&1 | tee "$OUT/engine.log"
else
  timeout 360 python3 experiments/device/gpu_engine_check.py --out "$OUT" 2>&1 | tee "$OUT/engine.log"
  echo "=== resources ($(date +%T))"
  env -u TRITON_INTERPRET timeout 120 python3 -m sparserl.rollout.gpu.resources 2>&1 | tee "$OUT/resources.log"
fi
rc=${PIPESTATUS[0]}
echo "=== done ($(date +%T)) rc $rc"
exit "$rc"
