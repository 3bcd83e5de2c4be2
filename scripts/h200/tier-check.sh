#!/usr/bin/env bash
# Both dynamic tiers with their pack on the GPU: builds the CUDA engine from .export/ (moeslots engine build
# --export-source .export) and runs tests/engine/test_native_tier.py and test_fetch_tier.py (fetch and fetch-split) with
# MOESLOTS_TEST_PACK=gpu (placement counts against the simulator, logits against stock within GPU rounding), then the
# fetch op's test over CUDA. From the repository root, wheels in .whl/; the tests' report in $OUT/tier-check.txt.
set -u
R=$(pwd)
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site CUDA_VISIBLE_DEVICES=0
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | grep -v WARN
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site . 2>&1 | grep -v WARN
cd /tmp && time timeout ${BUILD_LIMIT:-900} python3 -P -m moeslots engine build --cuda --from-source $R/.export --cmake-arg=-DGGML_CUDA_FA=OFF > /tmp/b.txt 2>&1; echo "build rc $?"; tail -3 /tmp/b.txt
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
(cd /tmp && MOESLOTS_TEST_PACK=gpu timeout 300 python3 -m pytest -q -p no:cacheprovider -o addopts="" --tb=short \
    $R/tests/engine/test_native_tier.py $R/tests/engine/test_fetch_tier.py > "$OUT/tier-check.txt" 2>&1)
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tier-check.txt" | tail -15
cd $R && bash scripts/h200/fetch-op.sh | tail -1
