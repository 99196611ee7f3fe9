#!/usr/bin/env bash
# The bf16 / AMX measurements in one device call (~9 min) on the lent GPU machine's host, a 16-vCPU AMX Xeon
# (docs/results/cuda/): the jobs of experiments/device/amx_check.sh and the OpenVINO GenAI comparisons, side by side,
# each on 2 vCPUs of its own (one physical core's two threads where the CPU has them, as a 2-vCPU cloud
# instance), plus the CUDA determinism tests on the GPU with the remaining vCPUs:
#   setup   the wheels (.whl), OpenVINO's runtime trimmed to its CPU plugin (.ov/ov312.tar.xz: openvino,
#           openvino-genai, openvino-tokenizers for Python 3.12), SmolLM2's shapes with random weights
#           (random_smollm2.py) and its IR without weights (.ov/ir.tar.xz, tools/openvino_ir_skeleton.py);
#           the native build and the engine's bf16 kernel, measured (bf16_kernel_choice). Where that
#           step fails (the AMX path's first run on AMX hardware), everything after it runs without AMX
#           (SPARSERL_NATIVE_ARCH=... -mno-amx-*) and the log says so.
#   pair 0  the bf16 tests on AMX, the weight products per kernel, the AMX path's B-tile prefetch variants;
#   pair 1  bf16_decode.py at 256 tokens: fused bf16 (each kernel) against our float32, in one process;
#   pair 2  `sparserl bench rollout` bf16 at 256 tokens with OpenVINO GenAI's rows (docs/results/bench_openvino.md),
#           then the same in float32;
#   pair 3  the same at 1,024 tokens, R-KV 256 + 32 against OpenVINO's eviction at equal KV bytes;
#   pair 4  `sparserl bench learner`: float32 against bf16 mixed precision;
#   GPU     the CUDA resume-exactness tests with strict deterministic kernels (docs/results/cuda/).
# Jobs share the machine's memory system and L3, so absolute rates are lower than on an idle host; each
# comparison is within one process, per round, as always.
#   OUT=dir bash experiments/device/amx_device.sh 2>&1 | tee $OUT/main.log   # carry .whl .gpu .ov
# Everything it writes comes back in $OUT/results.tgz (a call returns at most 8 files).
#   SMOKE=1 OUT=/tmp/amxd bash experiments/device/amx_device.sh   # the script itself, small, on any CPU
# .ov, made here once (ignored by git: `echo /.ov/ >> .git/info/exclude`), after `sparserl bench setup-openvino`
# and one `sparserl bench rollout --peers openvino --dtype float32` (which exports the IR):
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 -d /tmp/ovw openvino==2026.4.1 openvino-genai==2026.4.1.0 \
#     openvino-tokenizers==2026.4.1.0 openvino-telemetry==2025.2.0
#   mkdir /tmp/ovw/x && cd /tmp/ovw/x && for w in ../*.whl; do unzip -q $w; done && rm -rf openvino/include \
#     openvino/cmake openvino/libs/cache.json openvino/libs/libopenvino_intel_{gpu,npu}_plugin.so \
#     openvino/libs/libopenvino_{onnx,tensorflow,tensorflow_lite,paddle,gguf,jax,pytorch}_frontend.so* \
#     && tar cJf $REPO/.ov/ov312.tar.xz openvino* ; cd $REPO
#   python3 tools/openvino_ir_skeleton.py pack ~/.cache/sparserl/openvino/smollm2-135m-fp32 .ov/ir.tar.xz
#   PARTS="p2 gpu" F32=0 ...     # some of the jobs (p0-p4, gpu); F32=0 leaves out pair 2's float32 bench
set -uo pipefail
OUT=${OUT:-/tmp/amx_device}; SMOKE=${SMOKE:-0}; mkdir -p "$OUT"
PARTS=${PARTS:-"p0 p1 p2 p3 p4 gpu"}; run() { [[ " $PARTS " == *" $1 "* ]]; }
if [ -d .whl ] && ! python3 -c "import pydantic, math_verify, gguf" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site || exit 1
fi
if [ -f .ov/ov312.tar.xz ] && ! python3 -c "import openvino_genai" 2>/dev/null; then
  mkdir -p /tmp/ovsite && tar xJf .ov/ov312.tar.xz -C /tmp/ovsite && export PYTHONPATH=/tmp/ovsite${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export SPARSERL_CACHE=${SPARSERL_CACHE:-/tmp/sparserl-cache} OMP_NUM_THREADS=2
SP="python3 -m sparserl.cli"
T0=$(date +%s); stamp() { echo "[$(( $(date +%s) - T0 ))s] $*"; }

echo "=== machine"
grep -m1 'model name' /proc/cpuinfo; nproc
grep -m1 flags /proc/cpuinfo | tr ' ' '\n' | grep -E 'amx|avx512_bf16|avx512_vnni' | tr '\n' ' '; echo
lscpu 2>/dev/null | grep -E 'Thread|Core|Socket|L2|L3|NUMA node' | tr -s ' '
nvidia-smi -L 2>/dev/null
# 2-vCPU pairs: one physical core's two threads where the CPU has them, else consecutive CPUs
mapfile -t PAIRS < <(python3 - <<'PY'
import glob, os
cpus = sorted(os.sched_getaffinity(0))
groups = []
for c in cpus:
    try:
        sib = open(f"/sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list").read().strip()
    except OSError:
        sib = str(c)
    ids = []
    for part in sib.split(","):
        a, _, b = part.partition("-")
        ids += range(int(a), int(b or a) + 1)
    g = tuple(i for i in sorted(ids) if i in cpus)
    if g not in groups:
        groups.append(g)
if all(len(g) == 2 for g in groups):
    pairs = [",".join(map(str, g)) for g in groups]
else:
    pairs = [f"{cpus[i]},{cpus[i + 1]}" for i in range(0, len(cpus) - 1, 2)]
print("\n".join(pairs))
PY
)
echo "pairs: ${PAIRS[*]}"
npairs=${#PAIRS[@]}
pin() { echo "taskset -c ${PAIRS[$(( $1 % npairs ))]}"; }  # job i on pair i (shared where there are fewer)
REST=$(for ((i = 5; i < npairs; i++)); do printf '%s,' "${PAIRS[$i]}"; done | sed 's/,$//')

stamp "setup: the model, its IR, the native build and the bf16 kernel"
[ -f "$SPARSERL_CACHE/smollm2-135m-instruct/model.safetensors" ] || \
  CUDA_VISIBLE_DEVICES= python3 tools/random_smollm2.py .gpu/smol "$SPARSERL_CACHE/smollm2-135m-instruct" 2>&1 | grep -v shards &
[ -f .ov/ir.tar.xz ] && [ ! -f "$SPARSERL_CACHE/openvino/smollm2-135m-fp32/openvino_model.xml" ] && \
  python3 tools/openvino_ir_skeleton.py unpack .ov/ir.tar.xz "$SPARSERL_CACHE/openvino/smollm2-135m-fp32" &
CHOICE="import torch; torch.set_num_threads(2); from sparserl.rollout import native, bf16_kernel_choice as c; \
print('compiler', native._compiler(), '| library', native.library() is not None, '| bf16 kernels', native.bf16_kernels(), \
'| torch', torch.__version__); print('choice', c.choose('cpu').to_dict())"
CUDA_VISIBLE_DEVICES= timeout 120 $(pin 0) python3 -c "$CHOICE" > "$OUT/choice.log" 2>&1
rc=$?; tail -3 "$OUT/choice.log"
if [ $rc -ne 0 ]; then
  echo "!!! the bf16 kernel's measurement failed (exit $rc): everything below runs without AMX"
  export SPARSERL_NATIVE_ARCH="-march=native -mno-amx-tile -mno-amx-bf16 -mno-amx-int8"
  CUDA_VISIBLE_DEVICES= timeout 120 $(pin 0) python3 -c "$CHOICE" >> "$OUT/choice.log" 2>&1; tail -2 "$OUT/choice.log"
fi
wait
python3 -c "import openvino_genai, openvino; print('openvino', openvino.__version__, openvino.Core().get_property('CPU', 'FULL_DEVICE_NAME'))" 2>&1 | tail -1

L256="--batch 16 --max-new-tokens 256 --kv-budget 128"; L1024="--batch 16 --max-new-tokens 1024 --kv-budget 256 --step-length 32 --compress-prompt"
TOK=256; R=3; R2=2
[ "$SMOKE" = 1 ] && { L256="--batch 2 --max-new-tokens 16 --kv-budget 48"; L1024="$L256 --step-length 8 --compress-prompt"; TOK=16; R=1; R2=1; }
export CUDA_VISIBLE_DEVICES=
stamp "parallel jobs"
run p0 && ( $(pin 0) timeout ${TEST_S:-150} python3 -m pytest -q -p no:cacheprovider -p no:benchmark -o addopts= \
    tests/test_native_bf16.py tests/test_fused_bf16.py tests/test_bf16_kernel_choice.py tests/test_dtype_auto.py > "$OUT/p0_tests.log" 2>&1
  $(pin 0) timeout 100 python3 experiments/kernels/bf16_linear_bench.py --rounds 3 --out "$OUT/amx_linear.json" > "$OUT/p0_linear.log" 2>&1
  $(pin 0) timeout 150 python3 experiments/kernels/bf16_kernel_variants.py --rounds 3 \
    --only "prefetch 0,amx,amx prefetch 0,amx prefetch 1,amx prefetch 2,amx prefetch 4" --json "$OUT/amx_variants.json" > "$OUT/p0_variants.log" 2>&1
  stamp "pair 0 done" ) &
run p1 && ( $(pin 1) timeout 400 python3 experiments/rollout/bf16_decode.py --tokens $TOK --budget 128 --rounds $R --mismatch-n 0 --skip-eager \
    --json "$OUT/amx_L256.json" > "$OUT/p1_decode.log" 2>&1; stamp "pair 1 done" ) &
run p2 && ( $(pin 2) timeout 260 $SP bench rollout $L256 --compressors none,rkv --peers openvino --no-hf --dtype bfloat16 --repeat $R \
    --json "$OUT/ov_bf16_L256.json" > "$OUT/p2_ov256.log" 2>&1
  [ "${F32:-1}" = 1 ] && $(pin 2) timeout 200 $SP bench rollout $L256 --compressors none --peers openvino --no-hf --dtype float32 --repeat $R \
    --json "$OUT/ov_f32_L256.json" >> "$OUT/p2_ov256.log" 2>&1; stamp "pair 2 done" ) &
run p3 && ( $(pin 3) timeout 480 $SP bench rollout $L1024 --compressors none,rkv --peers openvino --no-hf --dtype bfloat16 --repeat $R2 \
    --json "$OUT/ov_bf16_L1024.json" > "$OUT/p3_ov1024.log" 2>&1; stamp "pair 3 done" ) &
run p4 && ( $(pin 4) timeout 300 $SP bench learner data.eval=null --repeat 3 --json "$OUT/amx_learner.json" > "$OUT/p4_learner.log" 2>&1
  stamp "pair 4 done" ) &
GPU_TESTS=${GPU_TESTS:-"tests/test_train.py::test_resume_gives_the_same_next_step
  tests/test_train.py::test_resume_with_the_update_forward_gives_the_same_next_step
  tests/test_train.py::test_old_logprobs_from_the_update_forward_equal_a_scoring_forward
  tests/test_train.py::test_deterministic_kernels_are_asked_for_on_cuda_only tests/test_replay.py tests/test_logprobs.py"}
if run gpu && nvidia-smi -L > /dev/null 2>&1 && [ -n "$REST" ]; then
  ( CUDA_VISIBLE_DEVICES=0 SPARSERL_TEST_DEVICE=cuda OMP_NUM_THREADS=1 taskset -c "$REST" timeout 300 python3 -m pytest -v -n 4 \
      -p no:cacheprovider -p no:benchmark -o addopts= $GPU_TESTS \
      > "$OUT/gpu_tests.log" 2>&1; stamp "GPU tests done" ) &
fi
wait
stamp "all done"

echo "=== bf16 tests (pair 0)"; grep -E "passed|failed|error" "$OUT/p0_tests.log" | tail -5
echo "=== products per kernel"; tail -6 "$OUT/p0_linear.log"
echo "=== B-tile prefetch variants"; tail -7 "$OUT/p0_variants.log"
echo "=== bf16_decode 256 (pair 1)"; tail -12 "$OUT/p1_decode.log"
echo "=== learner (pair 4)"; grep -E '^(numerics|round|bfloat16|old_logprobs)|rror' "$OUT/p4_learner.log" | tail -6
echo "=== GPU tests"; [ -f "$OUT/gpu_tests.log" ] && grep -E "FAILED|ERROR|passed|failed" "$OUT/gpu_tests.log" | grep -v PASSED | tail -12
echo "=== OpenVINO logs"; grep -iE "rror|skipped|Traceback" "$OUT/p2_ov256.log" "$OUT/p3_ov1024.log" | tail -8
python3 - "$OUT"/ov_*.json <<'PY'
import json, statistics, sys
for path in sys.argv[1:]:
    try:
        doc = json.load(open(path))
    except (OSError, ValueError):
        print(path, "missing"); continue
    m = doc["machine"]
    choice = m.get("bf16_kernel_choice") or {}
    print(f"{path.rsplit('/', 1)[-1]}: {m.get('cpu')} {m.get('isa')} {m.get('dtype')} bf16 kernel {choice.get('kernel')} ({choice.get('reason')})")
    rows = {(r["engine"], r["compressor"]): r for r in doc["results"]}
    for r in doc["results"]:
        print(f"  {r['engine']:>9} {r['compressor']:>9} {r.get('bf16_kernel') or '-':>11} {r['tokens_per_s']:7.0f} tok/s "
              f"runs {[round(x) for x in r['tokens_per_s_runs']]} kv_peak {r['kv_bytes_peak'] / 2**20:6.1f} MiB")
    for ours, theirs in ((("sparserl", "none"), ("openvino", "none")), (("sparserl", "rkv"), ("openvino", "eviction"))):
        if ours in rows and theirs in rows:
            per = [a / b for a, b in zip(rows[ours]["tokens_per_s_runs"], rows[theirs]["tokens_per_s_runs"])]
            print(f"  {'/'.join(ours)} vs {'/'.join(theirs)}: {statistics.median(per):.2f}x per round {[round(x, 2) for x in per]}")
PY
# a call returns at most 8 files: the logs and JSON in one archive, beside main.log (the caller's tee)
tar czf "$OUT/results.tgz" -C "$OUT" $(cd "$OUT" && ls *.json *.log 2>/dev/null | grep -vx main.log) \
  && (cd "$OUT" && ls *.json *.log | grep -vx main.log | xargs rm -f)
exit 0
