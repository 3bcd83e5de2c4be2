#!/bin/bash
# The engine's exactness on this GPU, one PASS/FAIL line per case: the CUDA engine built from .export/ (skipped when
# /tmp/site has one), then
#   1. the fetch ops' test over CUDA0 (tests/engine/moe_fetch_op.cpp: the tier's rule, copies and publish against
#      the CPU reference, the take's timeout) and over the CPU backend, and the join op's over CUDA0
#      (tests/engine/moe_join_op.cpp);
#   2. MUL_MAT_ID with negative ids over CUDA0 (tests/engine/mmid_op.cpp, the small shape);
#   3. every policy's logits against static's for decode batches of 1 to 8 tokens (moeslots.engine.bench.policycheck,
#      the bundled model and the tiny qwen3moe the tests write), allowed 1.5x the gap between stock's two placements
#      (all experts on the GPU, all in host memory); and, on the bundled model (it has a NextN block), MTP greedy
#      decoding with 3 drafts under each policy giving static's tokens as long as stock's placements agree.
# CI runs the CPU twins (tests/engine/test_moe_fetch_op.py, test_moe_join_op.py, test_mmid_op.py, test_policycheck.py).
# Usage (repository root): bash scripts/h200/policy-check.sh; WAIT (600) bounds the wait for the engine's build.
# Results: $OUT/policy-check.txt, ending with "policy-check: N of M steps passed".
set -uo pipefail
source scripts/h200/common.sh
WAIT=${WAIT:-600}; START=$(date +%s)
{
install_and_build
while [ ! -f /tmp/site/.moeslots-cuda ] && ! grep -q "build rc" $B/build.txt 2>/dev/null; do
  [ $(( $(date +%s) - START )) -gt "$WAIT" ] && { echo "FAIL the CUDA engine did not build in $WAIT s"; break; }
  sleep 5
done
[ -f /tmp/site/.moeslots-cuda ] || { tail -20 $B/build.txt; echo "policy-check: 0 of 6 steps passed"; exit 1; }
PKG=$(python3 -P -c "import llama_cpp, os; print(os.path.dirname(llama_cpp.__file__))")
LIB=$PKG/lib; INC=$(dirname "$PKG")/include
ok=0; n=0
step() {   # $1: the step's name; the rest: its command
  local name=$1; shift
  n=$((n + 1))
  if "$@" > $B/step.txt 2>&1; then ok=$((ok + 1)); echo "PASS $name: $(tail -1 $B/step.txt)"
  else echo "FAIL $name:"; grep -E "^FAIL|error|Error" $B/step.txt | head -20; tail -3 $B/step.txt; fi
  grep -E "^(ok|FAIL|PASS) " $B/step.txt | sed 's/^/    /'
}
g++ -O2 -std=c++17 tests/engine/moe_fetch_op.cpp -I"$INC" -L"$LIB" -lggml -lggml-base -lggml-cpu \
    -Wl,-rpath,"$LIB" -o /tmp/moe_fetch_op 2>/dev/null
g++ -O2 -std=c++17 tests/engine/moe_join_op.cpp -I"$INC" -L"$LIB" -lggml -lggml-base -lggml-cpu \
    -Wl,-rpath,"$LIB" -o /tmp/moe_join_op 2>/dev/null
g++ -O2 -std=c++17 tests/engine/mmid_op.cpp -I"$INC" -L"$LIB" -lggml -lggml-base -lggml-cpu \
    -Wl,-rpath,"$LIB" -o /tmp/mmid_op 2>/dev/null
step "fetch op, CUDA0" /tmp/moe_fetch_op --backend CUDA0 --steps 400
step "fetch op, CPU" /tmp/moe_fetch_op --backend CPU
step "join op, CUDA0" /tmp/moe_join_op --backend CUDA0
step "negative expert ids, CUDA0" /tmp/mmid_op --backend CUDA0
step "policies, bundled model" python3 -P -m moeslots.engine.bench.policycheck --threads 8
[ -f /tmp/tiny-qwen.gguf ] || (cd /tmp && $M synth -o /tmp/tiny-qwen.gguf --arch qwen3moe --layers 2 --n-embd 128 \
    --heads 4 --kv-heads 2 --experts 16 --experts-used 4 --expert-ff 64 --vocab 320 --dtype f16 --no-nextn --seed 4 \
    > /dev/null 2>&1)
step "policies, tiny qwen3moe" python3 -P -m moeslots.engine.bench.policycheck /tmp/tiny-qwen.gguf --slots 12 \
    --threads 8
echo "policy-check: $ok of $n steps passed"
} 2>&1 | tee "$OUT/policy-check.txt"
