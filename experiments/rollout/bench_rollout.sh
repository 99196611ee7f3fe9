#!/usr/bin/env bash
# The rollout benchmark series recorded in docs/results/ (run on an idle machine, one at a time).
set -e
out=${1:-docs/results}
sparserl bench rollout --batch 16 --max-new-tokens 256 --kv-budget 128 --step-length 64 --compressors none,rkv,snapkv,streaming,h2o --json $out/bench_rollout_L256.json
sparserl bench rollout --batch 16 --max-new-tokens 1024 --kv-budget 256 --step-length 128 --compressors none,rkv --json $out/bench_rollout_L1024.json
sparserl bench rollout --batch 16 --max-new-tokens 2048 --kv-budget 256 --step-length 128 --compressors none,rkv,snapkv --no-hf --json $out/bench_rollout_L2048.json
