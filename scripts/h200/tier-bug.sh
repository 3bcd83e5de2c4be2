#!/usr/bin/env bash
# The host tier's verify-batch failure on CUDA taken apart (scripts/h200/tier_bug.py: which rows differ, whether the
# routing flipped, whether it remains with the routing replayed), then again with CUDA's op fusion off. Needs the
# CUDA engine installed in /tmp/site (scripts/h200/tier-check.sh or sidebyside.sh STAGE=build builds it). From the
# repository root; the report in $OUT/tier-bug.txt.
set -u
source scripts/h200/common.sh
{
  echo "== fusion on"; timeout 240 python3 -P scripts/h200/tier_bug.py 2>&1 | grep -E "^(E|  )"
  echo "== GGML_CUDA_DISABLE_FUSION=1"
  GGML_CUDA_DISABLE_FUSION=1 timeout 240 python3 -P scripts/h200/tier_bug.py 2>&1 | grep -E "^(E|  )"
} | tee "$OUT/tier-bug.txt"
