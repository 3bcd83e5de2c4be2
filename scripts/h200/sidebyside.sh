#!/usr/bin/env bash
# moeslots beside llama.cpp b11549's own expert cache on the H200 box (docs/measurements.md, "Beside llama.cpp's own
# expert cache"): the CUDA engine built from .export/ and llama.cpp's llama-bench from .llb/llamacpp-b11549.tar.xz
# (scripts/sidebyside/prepare.sh makes it), the 30B-A3B-shape qwen3moe written, this box's costs for the tier, then
# scripts/sidebyside/run.sh over pinned/mmap x 16/6 threads x routings at 32 and 64 slots (25 % and 50 % of the
# expert bytes). From the repository root:
#   STAGE=build bash scripts/h200/sidebyside.sh     # both builds (llama-bench niced), the model; waits up to WAIT s
#   STAGE=run   bash scripts/h200/sidebyside.sh     # waits for the builds, starts the measurement, returns after
#                                                   # LIMIT s (540) with $OUT/sidebyside.md and .json so far
#   STAGE=collect bash scripts/h200/sidebyside.sh   # waits up to LIMIT s more for it; the table again
# ROUTING (default: random tokens and the routing donor's chat trace, sampled), N (decode tokens, 64), REPS (1),
# POLICIES (moeslots', static,hybrid,dynamic,auto), LOADS (pinned,mmap; fetch and fetch-split need pinned); FIRST=1:
# after the build's tests, the op test over CUDA and a first static/fetch/fetch-split reading at 64 slots, 6 threads. Without a llama-bench build, moeslots' columns alone.
# The costs the tier and `--policy auto` use are written into the config as a calibration: the CPU expert rate at 16
# and 6 threads from `bench decode --timing` on this box (the CPU split's compute minus its fixed part at 127 slots),
# uploads from its `doctor --calibrate` (pinned single-slab and pageable rates); the GPU-stepped tier's reading rate
# and its CPU share's cost per layer as FIRST=1 measured them (engine/machine/fetch_rates.py), else the cost model's defaults.
set -u
. "$(dirname "$0")/common.sh"
STAGE=${STAGE:-build}; WAIT=${WAIT:-540}; N=${N:-64}; REPS=${REPS:-1}
ROUTING=${ROUTING:-random,$R/profiles/data/moeslots-donor-qwen3-30b-a3b-chat-sampled.npz}
L=/tmp/llb; START=$(date +%s)
{
if [ "$STAGE" = build ]; then
  echo "== $(date +%T) machine: $(nproc) cores, $(nvidia-smi --query-gpu=name,memory.free --format=csv,noheader)"
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | grep -v WARN
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site . 2>&1 | grep -v WARN
  [ -f /tmp/site/.moeslots-cuda ] || setsid nohup bash -c "cd /tmp && $M engine build --cuda --from-source $R/.export \
      --cmake-arg=-DGGML_CUDA_FA=OFF > $B/build.txt 2>&1; echo \"build rc \$?\" >> $B/build.txt; \
      grep -q 'build rc 0' $B/build.txt && touch /tmp/site/.moeslots-cuda" > /dev/null 2>&1 &
  [ -x $L/build/bin/llama-bench ] || setsid nohup nice -n 10 bash -c "bash $R/scripts/sidebyside/build.sh \
      $R/.llb/llamacpp-b11549.tar.xz $L cuda > $B/llb-build.txt 2>&1; echo \"llb rc \$?\" >> $B/llb-build.txt" \
      > /dev/null 2>&1 &
  [ -f /tmp/big.gguf ] || { ( cd /tmp && time $M synth -o /tmp/big.part.gguf $BIGFLAGS > $B/synth-big.txt 2>&1 \
      && mv /tmp/big.part.gguf /tmp/big.gguf ); tail -2 $B/synth-big.txt; }
  while [ $(( $(date +%s) - START )) -lt "$WAIT" ]; do
    grep -q "build rc" $B/build.txt 2>/dev/null && grep -q "llb rc" $B/llb-build.txt 2>/dev/null && break
    sleep 5
  done
  echo "== $(date +%T) after $(( $(date +%s) - START )) s:"; tail -2 $B/build.txt 2>/dev/null; tail -3 $B/llb-build.txt 2>/dev/null
  if [ -f /tmp/site/.moeslots-cuda ]; then   # both tiers' placement and uploads with the pack on the GPU
    ( cd /tmp && MOESLOTS_TEST_PACK=gpu timeout 180 python3 -m pytest -q -p no:cacheprovider -o addopts="" \
        $R/tests/engine/test_native_tier.py $R/tests/engine/test_fetch_tier.py 2>&1 | tail -15 )
    bash scripts/h200/fetch-op.sh | tail -7
    if [ -n "${FIRST:-}" ] && [ -f /tmp/big.gguf ]; then
      # the GPU-stepped tier's own costs on this model (pinned, 64 slots, 6 threads): its reading rate and the CPU
      # share's cost per layer, for the calibration STAGE=run writes ($B/fetch-costs.txt), then a first reading
      (cd /tmp && timeout 200 python3 -P - > $B/fetch-costs.txt 2>&1 <<'PY'
from moeslots.engine.machine import fetch_rates
from moeslots.engine.llm.model import LoadOptions, Model
with Model("/tmp/big.gguf", LoadOptions(experts_on_host=True, use_mmap=False)) as m:
    moe = [il for il in m.facts.moe_layers if il < m.facts.n_layer]
    g, s = fetch_rates.fetch_rates(m, moe, 64, 6, 32, False, print)
print(f"fetch_gbps {g:.2f} share_ms {s:.4f}")
PY
      ); tail -12 $B/fetch-costs.txt
      (cd /tmp && timeout 240 $M bench repick /tmp/big.gguf --every 0 --policy static,fetch,fetch-split --slots 64 \
          --replay uniform --no-mmap --threads 6 -n 64 2>&1 | tail -8)
    fi
  fi
else
  # STAGE=run starts the measurement (unless it is running or done), STAGE=collect only waits; both return after
  # LIMIT s (default 540) with the table of what has finished, the rest still running for a later STAGE=collect
  LIMIT=${LIMIT:-540}
  while ! grep -q "llb rc" $B/llb-build.txt 2>/dev/null || ! grep -q "build rc" $B/build.txt 2>/dev/null; do
    [ $(( $(date +%s) - START )) -gt "$LIMIT" ] && { echo "builds not done after $LIMIT s"; break; }
    sleep 5
  done
  tail -2 $B/build.txt; tail -3 $B/llb-build.txt
  if [ "$STAGE" = run ] && [ ! -f $B/sbs.started ]; then
    touch $B/sbs.started; $M doctor | head -3
  python3 -P - <<'EOF'
from moeslots.engine.machine import calibrate
import os, re
fc = open("/tmp/bench/fetch-costs.txt").read() if os.path.exists("/tmp/bench/fetch-costs.txt") else ""
m = re.search(r"fetch_gbps ([0-9.]+) share_ms ([0-9.]+)", fc)
fetch, share = (float(m.group(1)), float(m.group(2))) if m else (0.0, 0.0)   # 0: the cost model's defaults
c = calibrate.Calibration(machine=calibrate.machine_id(), date="2026-12-04", model="big.gguf", slab_mb=2.654208,
                          upload_pageable_gbps=5.34, upload_pinned_gbps=26.8, cpu_gbps=63.4, base_ms=8.8,
                          method="split", threads=16, cpu_threads=(6, 16), cpu_gbps_threads=(31.1, 63.4),
                          fetch_gbps=fetch, share_ms=share)
print("costs written:", calibrate.save(c), c.render())
EOF
    if [ -x $L/build/bin/llama-bench ]; then
      setsid nohup bash -c "PYTHON=python3 bash scripts/sidebyside/run.sh /tmp/big.gguf $L/build/bin/llama-bench \
          --out /tmp/sbs --routing '$ROUTING' -n $N -r $REPS --policies ${POLICIES:-static,hybrid,dynamic,auto} \
          --load ${LOADS:-pinned,mmap} \
          > $B/sbs.txt 2>&1; echo \"sbs rc \$?\" >> $B/sbs.txt" > /dev/null 2>&1 &
    else   # moeslots' columns alone, pinned, 16 and 6 threads
      echo "no llama-bench: moeslots alone"
      RP=$(echo "$ROUTING" | sed 's/^random/uniform/; s/,random/,uniform/')
      setsid nohup bash -c "for t in 16 6; do $M bench repick /tmp/big.gguf --every 0 --slots 32,64 --replay '$RP' \
          --policy ${POLICIES:-static,hybrid,dynamic,auto} --threads \$t -n $N --no-mmap --json /tmp/sbs-t\$t.json; \
          done > $B/sbs.txt 2>&1; echo \"sbs rc \$?\" >> $B/sbs.txt; cp /tmp/sbs-t*.json $OUT/" > /dev/null 2>&1 &
    fi
  fi
  while ! grep -q "sbs rc" $B/sbs.txt 2>/dev/null && [ $(( $(date +%s) - START )) -lt "$LIMIT" ]; do sleep 5; done
  tail -40 $B/sbs.txt
  grep -q "sbs rc 0" $B/sbs.txt || python3 -P scripts/sidebyside/table.py /tmp/sbs
  cp /tmp/sbs/sidebyside.md /tmp/sbs/sidebyside.json /tmp/sbs-t*.json "$OUT/" 2>/dev/null
  tar czf "$OUT/sbs-raw.tgz" -C /tmp/sbs raw manifest.jsonl facts.json 2>/dev/null
fi
tar czf "$OUT/logs.tgz" -C $B . 2>/dev/null
} 2>&1 | tee "$OUT/sidebyside-$STAGE.txt"
