#!/usr/bin/env bash
# A short H200 call: a CUDA build without the flash-attention kernels (~40 % fewer CUDA files; the cache's paths
# do not use them) and the bundled-model diagnostics (scripts/h200/diagnose_tiny.py). Carry .export and .whl.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
R=$(pwd)
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site TIMEFORMAT="wall %R s" CUDA_VISIBLE_DEVICES=0
M="python3 -P -m moeslots"
{
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | grep -v WARN
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site . 2>&1 | grep -v WARN
echo "== $(date +%T) build (no flash attention)"
cd /tmp && time timeout ${BUILD_S:-150} $M engine build --cuda --cmake-arg -DGGML_CUDA_FA=OFF --from-source "$R/.export/llama_cpp_python-0.3.36" 2>&1 | tail -2
echo "== $(date +%T) diagnostics"
timeout ${DIAG_S:-60} python3 -P $R/scripts/h200/diagnose_tiny.py
echo "== $(date +%T) done"
} 2>&1 | tee "$OUT/quick-verify.txt"
