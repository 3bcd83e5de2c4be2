#!/bin/bash
# GGML_OP_MOE_FETCH and GGML_OP_MOE_FETCH_JOIN over the CUDA backend: the op tests CI runs on the CPU
# (tests/engine/moe_fetch_op.cpp and moe_join_op.cpp, tests/engine/test_moe_fetch_op.py and test_moe_join_op.py),
# built against the installed CUDA engine and run on CUDA0 with the host experts and the answers in pinned memory
# (the device's host buffer type): the tier's rule stepped by the GPU and its copies made by the GPU must match the
# reference step for step, bit for bit; the join must wait for its answer in the GPU's queue and add it bit for bit.
# Usage (repository root, CUDA engine installed in /tmp/site as for the other scripts): scripts/h200/fetch-op.sh
# Result: $OUT/fetch-op.txt, "12 passed, 0 failed, 0 skipped" at its end, then "20 passed, 0 failed, 0 skipped".
set -uo pipefail
source scripts/h200/common.sh
PKG=$(python3 -P -c "import llama_cpp, os; print(os.path.dirname(llama_cpp.__file__))")
LIB=$PKG/lib
INC=$(dirname "$PKG")/include
[ -f "$INC/ggml.h" ] || INC=$(ls -d "$R"/.export/vendor/llama.cpp/ggml/include 2>/dev/null | head -1)
g++ -O2 -std=c++17 tests/engine/moe_fetch_op.cpp -I"$INC" -L"$LIB" -lggml -lggml-base -lggml-cpu -Wl,-rpath,"$LIB" \
    -o /tmp/moe_fetch_op || exit 1
g++ -O2 -std=c++17 tests/engine/moe_join_op.cpp -I"$INC" -L"$LIB" -lggml -lggml-base -lggml-cpu -Wl,-rpath,"$LIB" \
    -o /tmp/moe_join_op || exit 1
/tmp/moe_fetch_op --backend CUDA0 --steps 400 > "$OUT/fetch-op.txt" 2>&1
rc=$?
/tmp/moe_join_op --backend CUDA0 >> "$OUT/fetch-op.txt" 2>&1 || rc=1
cat "$OUT/fetch-op.txt"
exit $rc
