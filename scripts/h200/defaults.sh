#!/usr/bin/env bash
# What a user gets with no flags on this box, beside llama.cpp b11549's own expert cache (docs/performance.md,
# "What you get with no flags"). From the repository root, with the engine's source in .export/ and llama.cpp's in
# .llb/llamacpp-b11549.tar.xz (scripts/sidebyside/prepare.sh):
#   STAGE=build bash scripts/h200/defaults.sh   # the CUDA engine and llama-bench built side by side (llama-bench
#       niced), the 30B-A3B-shape qwen3moe written; then, once the engine is in: whether a GPU-stepped tier leaves
#       the static cache slower after it (tier_residue.py, 16 threads), and `bench repick --policy default,...` at 6
#       threads with a config that starts empty: the first-run calibration's time and every policy's measured
#       ms/token beside its prediction. Waits up to WAIT s (540) for the builds.
#   STAGE=run bash scripts/h200/defaults.sh     # scripts/sidebyside/run.sh (its default column: the first-run
#       calibration, then auto) over LOADS (pinned) x THREADS (16,6) x ROUTING (random tokens and the donor chat
#       trace), detached; returns after LIMIT s (540) with the table so far. STAGE=collect waits for the rest.
set -u
. "$(dirname "$0")/common.sh"
STAGE=${STAGE:-build}; WAIT=${WAIT:-540}; LIMIT=${LIMIT:-540}; N=${N:-64}; REPS=${REPS:-1}
ROUTING=${ROUTING:-random,$R/profiles/data/moeslots-donor-qwen3-30b-a3b-chat-sampled.npz}
L=/tmp/llb; START=$(date +%s)
{
if [ "$STAGE" = build ]; then
  echo "== $(date +%T) machine: $(nproc) cores, $(nvidia-smi --query-gpu=name,memory.free --format=csv,noheader)"
  install_and_build
  [ -x $L/build/bin/llama-bench ] || setsid nohup nice -n 10 bash -c "bash $R/scripts/sidebyside/build.sh \
      $R/.llb/llamacpp-b11549.tar.xz $L cuda > $B/llb-build.txt 2>&1; echo \"llb rc \$?\" >> $B/llb-build.txt" \
      > /dev/null 2>&1 &
  [ -f /tmp/big.gguf ] || { ( cd /tmp && time $M synth -o /tmp/big.part.gguf $BIGFLAGS > $B/synth-big.txt 2>&1 \
      && mv /tmp/big.part.gguf /tmp/big.gguf ); tail -2 $B/synth-big.txt; }
  while [ $(( $(date +%s) - START )) -lt "$WAIT" ] && ! grep -q "build rc" $B/build.txt 2>/dev/null; do sleep 5; done
  echo "== $(date +%T) after $(( $(date +%s) - START )) s:"; tail -2 $B/build.txt 2>/dev/null
  if [ -f /tmp/site/.moeslots-cuda ] && [ -f /tmp/big.gguf ]; then
    (cd /tmp && timeout 150 python3 -P $R/scripts/h200/tier_residue.py /tmp/big.gguf 16 64 2>&1 \
        | grep -v "^llama\|^load\|^print_info" | tee $B/tier-residue.txt)
    left=$(( WAIT + 50 - ($(date +%s) - START) ))
    [ $left -gt 60 ] && (cd /tmp && rm -rf /tmp/cfg-fresh && XDG_CONFIG_HOME=/tmp/cfg-fresh timeout $left $M bench \
        repick /tmp/big.gguf --every 0 --policy default,static,fetch,fetch-split,hybrid --slots 32,64 \
        --replay uniform --no-mmap --threads 6 -n $N --json $OUT/policies-t6.json 2>&1 | grep -v "^llama" \
        | tee $B/policies-t6.txt)
  fi
  tail -3 $B/llb-build.txt 2>/dev/null
else
  while ! grep -q "llb rc" $B/llb-build.txt 2>/dev/null || ! grep -q "build rc" $B/build.txt 2>/dev/null; do
    [ $(( $(date +%s) - START )) -gt "$LIMIT" ] && { echo "builds not done after $LIMIT s"; break; }
    sleep 5
  done
  if [ "$STAGE" = run ] && [ ! -f $B/sbs.started ] && [ -x $L/build/bin/llama-bench ]; then
    touch $B/sbs.started
    setsid nohup bash -c "PYTHON=python3 bash scripts/sidebyside/run.sh /tmp/big.gguf $L/build/bin/llama-bench \
        --out /tmp/sbs --routing '$ROUTING' -n $N -r $REPS --threads ${THREADS:-16,6} --load ${LOADS:-pinned} \
        --policies ${POLICIES:-default,static,fetch,fetch-split,hybrid} > $B/sbs.txt 2>&1; \
        echo \"sbs rc \$?\" >> $B/sbs.txt" > /dev/null 2>&1 &
  fi
  while ! grep -q "sbs rc" $B/sbs.txt 2>/dev/null && [ $(( $(date +%s) - START )) -lt "$LIMIT" ]; do sleep 5; done
  tail -30 $B/sbs.txt
  grep -q "sbs rc" $B/sbs.txt || python3 -P scripts/sidebyside/table.py /tmp/sbs
  cp /tmp/sbs/sidebyside.md /tmp/sbs/sidebyside.json "$OUT/" 2>/dev/null
  tar czf "$OUT/sbs-raw.tgz" -C /tmp/sbs raw manifest.jsonl facts.json config 2>/dev/null
fi
tar czf "$OUT/logs.tgz" -C $B . 2>/dev/null
} 2>&1 | tee "$OUT/defaults-$STAGE.txt"
