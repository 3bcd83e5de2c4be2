#!/usr/bin/env bash
# Where a decode token's time goes, per policy, per layer, at 16 and 6 threads (scripts/h200/layer_trace.py), on the
# 30B-A3B-shape qwen3moe, experts pinned, random-token routing: builds the CUDA engine (engine source in .export/)
# while the model is written, then runs the trace (THREADS, SLOTS, N, CALS), or with SWEEP=0.25,0.5,1,2,4 fetch-split's
# split scaled by each factor (split_sweep.py), or with SETTLE=150 the CPU's rate read from the load's end for that
# many seconds, under the calibration's plan and a shuffled one (settle.py; THREADS, SLOTS). From the repository
# root: bash scripts/h200/layer-trace.sh
set -u
. "$(dirname "$0")/common.sh"
START=$(date +%s); WAIT=${WAIT:-420}
{
echo "== $(date +%T) machine: $(nproc) cores, $(nvidia-smi --query-gpu=name,memory.free --format=csv,noheader)"
lscpu | grep -E "^(Model name|Thread|Core|Socket|NUMA node\(s\)|CPU max MHz)" 2>/dev/null
install_and_build
[ -f /tmp/big.gguf ] || { ( cd /tmp && $M synth -o /tmp/big.part.gguf $BIGFLAGS > $B/synth-big.txt 2>&1 \
    && mv /tmp/big.part.gguf /tmp/big.gguf ); tail -1 $B/synth-big.txt; }
while [ $(( $(date +%s) - START )) -lt "$WAIT" ] && ! grep -q "build rc" $B/build.txt 2>/dev/null; do sleep 3; done
echo "== $(date +%T) after $(( $(date +%s) - START )) s:"; tail -2 $B/build.txt 2>/dev/null
if [ -f /tmp/site/.moeslots-cuda ] && [ -f /tmp/big.gguf ]; then
  if [ -n "${SWEEP:-}" ]; then   # fetch-split's split scaled by each factor of SWEEP (split_sweep.py)
    set -- $R/scripts/h200/split_sweep.py /tmp/big.gguf ${THREADS:-16,6} ${SLOTS:-64} $SWEEP
  elif [ -n "${SETTLE:-}" ]; then   # whether the CPU's rate settles after the load (settle.py)
    set -- $R/scripts/h200/settle.py /tmp/big.gguf ${THREADS:-6,16} $SETTLE ${SLOTS:-64}
  else
    set -- $R/scripts/h200/layer_trace.py /tmp/big.gguf ${THREADS:-16,6} ${SLOTS:-64,32} ${N:-48} ${CALS:-2}
  fi
  (cd /tmp && timeout ${LIMIT:-560} python3 -P "$@" 2>&1 \
      | grep -v "^llama\|^load_\|^load:\|^print_info\|^ggml_cuda\|^  Device" | tee $B/layer-trace.txt)
fi
tar czf "$OUT/logs.tgz" -C $B . 2>/dev/null
} 2>&1 | tee "$OUT/layer-trace.txt"
