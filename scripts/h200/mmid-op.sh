#!/bin/bash
# MUL_MAT_ID with negative expert ids over the CUDA backend: the op test CI runs on the CPU
# (tests/engine/mmid_op.cpp, tests/engine/test_mmid_op.py), built against the installed CUDA engine and run on CUDA0.
# Every type (f32 f16 bf16 q8_0 q4_K q5_K q6_K mxfp4) x batches 1..512 x valid / mixed / all-negative rows, plain and
# gate/up/swiglu (fused into one MMVQ/MMVF kernel for one token), b with one row per token and one per slot, so MMVQ,
# the MMVQ MoE kernel, MMQ (with and without the quantize-once scatter), MMF, MMVF and the generic fallback all run.
# Shapes: the test's small one (K=256 M=64 E=16 k=4) and a 30B-A3B-like one (K=2048 M=768 E=128 k=8, batches to 512).
# Then, when compute-sanitizer is there, a memcheck pass on the small shape: a negative id must read no memory.
# Usage (repository root, CUDA engine installed in /tmp/site as for the other scripts): scripts/h200/mmid-op.sh
# Results: $OUT/mmid-op-*.txt; every line "ok" and "N passed, 0 failed, 0 skipped" at the end of each.
set -uo pipefail
source scripts/h200/common.sh
OUT=${MMID_OUT:-$OUT}; mkdir -p "$OUT"

PKG=$(python3 -P -c "import llama_cpp, os; print(os.path.dirname(llama_cpp.__file__))")
LIB=$PKG/lib
INC=$(dirname "$PKG")/include
[ -f "$INC/ggml.h" ] || INC=$(ls -d "$R"/.export/vendor/llama.cpp/ggml/include "$R"/.export/*/vendor/llama.cpp/ggml/include 2>/dev/null | head -1)
echo "engine $PKG, headers $INC"
g++ -O2 -std=c++17 tests/engine/mmid_op.cpp -I"$INC" -L"$LIB" -lggml -lggml-base -lggml-cpu -Wl,-rpath,"$LIB" \
    -o /tmp/mmid_op || exit 1

rc=0
/tmp/mmid_op --backend CUDA0 > "$OUT/mmid-op-small.txt" 2>&1 || rc=1
tail -1 "$OUT/mmid-op-small.txt"
/tmp/mmid_op --backend CUDA0 --cols 2048 --rows 768 --experts 128 --used 8 \
    --types q4_K,q6_K,q8_0,f16,mxfp4 --batches 1,2,5,9,33,128,512 --ref-rows 8 \
    > "$OUT/mmid-op-30b.txt" 2>&1 || rc=1
tail -1 "$OUT/mmid-op-30b.txt"
# k other than 4 and 8 (the generic mm_ids_helper) and packs with fewer experts than k
for kE in "1 4" "3 8" "12 24"; do
    set -- $kE
    /tmp/mmid_op --backend CUDA0 --used $1 --experts $2 --types f16,q8_0,q4_K,mxfp4 \
        --batches 1,2,5,17,64,512 > "$OUT/mmid-op-k$1.txt" 2>&1 || rc=1
    tail -1 "$OUT/mmid-op-k$1.txt"
done
for kE in "4 3" "8 1" "8 5"; do
    set -- $kE
    /tmp/mmid_op --backend CUDA0 --pack --used $1 --experts $2 --types f16,q8_0,q4_K,mxfp4 \
        --batches 1,2,5,17,64,512 > "$OUT/mmid-op-pack$1x$2.txt" 2>&1 || rc=1
    tail -1 "$OUT/mmid-op-pack$1x$2.txt"
done
if command -v compute-sanitizer > /dev/null; then
    compute-sanitizer --tool memcheck --error-exitcode 3 /tmp/mmid_op --backend CUDA0 --batches 1,5,17,512 --types f16,q4_K,mxfp4 \
        > "$OUT/mmid-op-memcheck.txt" 2>&1 || rc=1
    grep -E "ERROR SUMMARY|passed," "$OUT/mmid-op-memcheck.txt"
else
    echo "no compute-sanitizer: memcheck pass skipped" | tee "$OUT/mmid-op-memcheck.txt"
fi
grep -h "^FAIL" "$OUT"/mmid-op-*.txt | head -20
exit $rc
