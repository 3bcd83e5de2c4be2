#!/usr/bin/env bash
# The H200 box's engine measurements, step by step (docs/performance.md quotes them; docs/lab/ has each run). From the
# repository root, with the exported engine source in .export/ and the dependency wheels in .whl/ (the box has no
# internet; docs/engine-build.md), or a CUDA engine wheel built earlier in .wheel/ (then no ~4-minute build):
#   STEPS="diag async heads" bash scripts/h200/measure.sh
#   STEPS="repick pinned overlap live long" bash scripts/h200/measure.sh
# Steps run in the order given; BUDGET (seconds from the start, default 3600) stops a step that would not finish in
# time, so a run with a deadline still returns what it measured. A second run on the same machine reuses
# /tmp/site (the CUDA engine) and the synthetic models.
# Steps: diag (the bundled model on CUDA: slots vs stock logits, <= 4-token batches; MTP on the trained head),
# async (--async-cpu on/off: decode at 0/32/64/96 slots with a 512-token prompt, and with MTP), heads (where the NextN
# block's experts live: slots/host/gpu, const head), repick (static vs re-pick, pageable uploads, code/chat/uniform
# routing), pinned (the same from pinned host memory, chat/uniform), repick15 (re-pick 1/16, pageable and pinned),
# live (live --repick auto, matched and mismatched profiles, 1,024 tokens), long (re-pick 100/500 over 1,024
# tokens, pinned), overlap (re-pick copies overlapping decode, pageable and pinned), calib (this machine's costs).
# Model: the 30B-A3B-shape glm4moe + NextN of common.sh ($G); routing replayed from the bundled model's traces.
# Engine v2: op (scripts/h200/mmid-op.sh: MUL_MAT_ID with negative ids over CUDA), v2 (the 30B-A3B-shape
# qwen3moe of the side-by-side table in shared/h200-box.md: prompt 512 at 50 % with host experts streamed or on the
# CPU, mmap and pinned; full residency with stats on/off against every expert on the GPU; decode at 25/50/75 % under
# uniform routing), v2mtp (MTP verify batches of 2-8 tokens through the cache), timing (where a decode token's time
# goes: the scheduler's clock, patch 0006).
# Routing donor: DONOR_MIN=M trains scripts/train/donor.sh's donor on CUDA for M minutes in the background
# from the start (beside the engine build; DONOR_FROM=DIR: an earlier donor's corpus.tar.xz and tokenizer.json); step donor exports it, checks its GGUF routes as PyTorch does and records
# its six traces (in bench.tgz: donor/); donorbench replays them on the 30B-A3B shape (static, re-pick, hybrid,
# dynamic; pinned and mmap; 16 and 6 threads).
# $OUT: measure.txt (log), bench.tgz (every JSON written so far; repacked after each step).
set -u
START=$(date +%s); BUDGET=${BUDGET:-3600}
. "$(dirname "$0")/common.sh"
left() { echo $(( START + BUDGET - $(date +%s) )); }
# run NAME MAX_S CMD...: with a timeout of min(MAX_S, what is left); skipped when under 20 s is left, or when it
# already succeeded on this machine (a second run with the same STEPS goes on where the first stopped)
run() {
  local name=$1 max=$2; shift 2
  if [ -f "$B/.ok-$name" ]; then echo "-- $(date +%T) $name: done earlier on this machine"; return; fi
  local l; l=$(left); [ "$max" -lt "$l" ] && l=$max
  if [ "$l" -lt 20 ]; then echo "-- $(date +%T) SKIP $name (no time left)"; return; fi
  echo "-- $(date +%T) $name (limit ${l}s)"
  time timeout "$l" "$@"; local rc=$?; echo "-- rc $rc $name"; [ $rc = 0 ] && touch "$B/.ok-$name"; pack
}
{
echo "== $(date +%T) machine"; nproc; nvidia-smi --query-gpu=name,memory.total,memory.free --format=csv,noheader
if [ -f /tmp/site/.moeslots-cuda ]; then
  echo "== warm machine: reusing /tmp/site (CUDA engine), models: $(ls /tmp/*.gguf 2>/dev/null | tr '\n' ' ')"
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --upgrade --target /tmp/site . 2>&1 | grep -v WARN
  BUILD=""
elif ls .wheel/*.whl >/dev/null 2>&1; then
  echo "== installing the CUDA engine wheel in .wheel/"
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl .wheel/*.whl 2>&1 | grep -v WARN
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site . 2>&1 | grep -v WARN
  touch /tmp/site/.moeslots-cuda; BUILD=""
else
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | grep -v WARN
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site . 2>&1 | grep -v WARN
  # CUDA_BUILD_ARGS: extra build flags; by default no FlashAttention kernels (half the build time; the decode and
  # prompt lengths measured here are short, and every engine compared in a table is built the same way)
  ( cd /tmp && time $M engine build --cuda --from-source "$R/.export" ${CUDA_BUILD_ARGS---cmake-arg=-DGGML_CUDA_FA=OFF} \
      > $B/build.txt 2>&1; rc=$?
    echo "build rc $rc" >> $B/build.txt; [ $rc = 0 ] && touch /tmp/site/.moeslots-cuda ) &
  BUILD=$!
fi
S1=""; S2=""; S3=""; DONOR=""
if [ -n "${DONOR_MIN:-}" ] && [ ! -f /tmp/donor/weights.pt ]; then
  echo "== $(date +%T) training the routing donor on CUDA for $DONOR_MIN minutes (background)"
  # DONOR_FROM=DIR: DIR/corpus.tar.xz and DIR/tokenizer.json of an earlier donor (the same text, the same tokens)
  if [ -n "${DONOR_FROM:-}" ] && [ ! -d /tmp/donor/corpus ]; then
    mkdir -p /tmp/donor && tar xJf "$DONOR_FROM/corpus.tar.xz" -C /tmp/donor && cp "$DONOR_FROM/tokenizer.json" /tmp/donor/
  fi
  ( PY=python3 bash $R/scripts/train/donor.sh /tmp/donor "$DONOR_MIN" cuda train-only > $B/donor-train.txt 2>&1
    echo "donor training rc $?" >> $B/donor-train.txt ) & DONOR=$!
fi
case " $STEPS " in *" v2 "*|*" donorbench "*|*" models "*|*" timing "*)
[ -f /tmp/big.gguf ] || { ( cd /tmp && time $M synth -o /tmp/big.part.gguf $BIGFLAGS > $B/synth-big.txt 2>&1 && mv /tmp/big.part.gguf /tmp/big.gguf; echo "synth rc $?" >> $B/synth-big.txt ) & S3=$!; } ;;
esac
case " $STEPS " in *" async "*|*" calib "*|*" repick"*|*" pinned "*|*" live "*|*" long "*|*" overlap "*|*" models "*|*" v2mtp "*)
[ -f /tmp/mtp.gguf ] || { ( cd /tmp && time $M synth -o /tmp/mtp.part.gguf $G > $B/synth.txt 2>&1 && mv /tmp/mtp.part.gguf /tmp/mtp.gguf; echo "synth rc $?" >> $B/synth.txt ) & S1=$!; } ;;
esac
case " $STEPS " in *" heads "*)
[ -f /tmp/mtpc.gguf ] || { ( cd /tmp && time $M synth -o /tmp/mtpc.part.gguf $G --const-head > $B/synth-const.txt 2>&1 && mv /tmp/mtpc.part.gguf /tmp/mtpc.gguf; echo "synth rc $?" >> $B/synth-const.txt ) & S2=$!; } ;;
esac
[ -n "$BUILD" ] && { wait $BUILD; tail -4 $B/build.txt
    W=$(ls -S ~/.cache/moeslots/wheels/*/*.whl 2>/dev/null | head -1); [ -n "$W" ] && ls -la "$W"; }
cd /tmp
$M doctor | head -3
echo 'What does `json.dumps` do?' > /tmp/q.txt
for step in $STEPS; do
echo "== $(date +%T) step $step ($(left) s left)"
case $step in
diag)
  run diagnose 90 python3 -P $R/scripts/h200/diagnose_tiny.py > $B/diagnose.txt 2>&1; cat $B/diagnose.txt | tail -30
  run mtp-tiny 60 $M bench mtp $TINY --drafts 1,2,3 --slots 0,16 -n 128 --threads 16 --prompt-file /tmp/q.txt --json $B/mtp-tiny.json ;;
async)
  [ -n "$S1" ] && { wait $S1; tail -2 $B/synth.txt; S1=""; }
  run async-on 100 $M bench decode /tmp/mtp.gguf --slots 0,32,64,96 -n 64 --prompt-len 512 --threads 16 --async-cpu --json $B/async-on.json
  run async-off 100 $M bench decode /tmp/mtp.gguf --slots 0,32,64,96 -n 64 --prompt-len 512 --threads 16 --no-async-cpu --json $B/async-off.json
  run async-mtp-on 50 $M bench mtp /tmp/mtp.gguf --drafts 1 --slots 64 -n 64 --threads 16 --mtp-head gpu --async-cpu --json $B/async-mtp-on.json
  run async-mtp-off 50 $M bench mtp /tmp/mtp.gguf --drafts 1 --slots 64 -n 64 --threads 16 --mtp-head gpu --no-async-cpu --json $B/async-mtp-off.json ;;
heads)
  [ -n "$S2" ] && { wait $S2; tail -2 $B/synth-const.txt; S2=""; }
  for H in host gpu slots; do
    run head-$H 45 $M bench mtp /tmp/mtpc.gguf --drafts 1,3 --slots 64 -n 96 --threads 16 --mtp-head $H --json $B/mtp-const-$H.json
  done ;;
calib)
  [ -n "$S1" ] && { wait $S1; S1=""; }
  run calibrate 90 $M doctor --calibrate /tmp/mtp.gguf --threads 16; cp /tmp/cfg/moeslots/config.toml $B/calibration.toml ;;
repick)
  [ -n "$S1" ] && { wait $S1; tail -2 $B/synth.txt; S1=""; }
  run repick-mmap 240 $M bench repick /tmp/mtp.gguf --every 0,1,16,100 --slots 19,32,64 --replay $P-code.csv,$P-chat.csv,uniform -n 256 --threads 16 --json $B/repick-mmap.json ;;
pinned)   # chat at 64 slots from pinned memory: where re-picking pays (docs/performance.md)
  run repick-pinned 200 $M bench repick /tmp/mtp.gguf --every 0,16,100,500 --slots 32,64 --replay $P-chat.csv,uniform -n 256 --threads 16 --no-mmap --json $B/repick-pinned.json ;;
repick15)  # re-pick 1/16: the per-re-pick fixed cost (patch 0015: no graph rebuild per re-pick)
  run repick15-mmap 120 $M bench repick /tmp/mtp.gguf --every 0,1,16 --slots 64 --replay $P-code.csv,$P-chat.csv -n 256 --threads 16 --json $B/repick15-mmap.json
  run repick15-pinned 150 $M bench repick /tmp/mtp.gguf --every 0,1,16 --slots 64 --replay $P-code.csv,$P-chat.csv -n 256 --threads 16 --no-mmap --json $B/repick15-pinned.json ;;
live)      # live --repick auto vs static and re-pick 16, pinned; the mismatched profile is where the simulator sees gains
  run live-matched 200 $M bench repick /tmp/mtp.gguf --every 0,16,auto --slots 32,64 --replay $P-chat.csv -n 1024 --threads 16 --no-mmap --json $B/repick-live-matched.json
  run live-chat-code 200 $M bench repick /tmp/mtp.gguf --every 0,16,auto --slots 32,64 --replay $P-chat.csv -n 1024 --threads 16 --no-mmap --profile-from $P-code.csv --json $B/repick-live-chat-code.json
  run live-code-chat 200 $M bench repick /tmp/mtp.gguf --every 0,16,auto --slots 32,64 --replay $P-code.csv -n 1024 --threads 16 --no-mmap --profile-from $P-chat.csv --json $B/repick-live-code-chat.json ;;
long)      # re-pick 500 fires twice in 1,024 tokens (profile rows 1,024 + 1,040 replayed: both traces have them)
  run repick-long 300 $M bench repick /tmp/mtp.gguf --every 0,100,500 --slots 32,64 --replay $P-chat.csv,$P-code.csv -n 1024 --threads 16 --no-mmap --json $B/repick-long.json ;;
overlap)
  run overlap-mmap 100 $M bench repick /tmp/mtp.gguf --every 0,1,16,100 --slots 32,64 --replay $P-code.csv -n 256 --threads 16 --overlap --json $B/repick-overlap-mmap.json
  run overlap-pinned 100 $M bench repick /tmp/mtp.gguf --every 0,1,16,100 --slots 32,64 --replay $P-code.csv -n 256 --threads 16 --overlap --no-mmap --json $B/repick-overlap-pinned.json ;;
models)    # only waits for the synthetic models (written beside the build, for later steps)
  [ -n "$S1" ] && { wait $S1; tail -1 $B/synth.txt; S1=""; }
  [ -n "$S3" ] && { wait $S3; tail -1 $B/synth-big.txt; S3=""; } ;;
op)
  run mmid-op 200 bash -c "cd $R && MMID_OUT=$B/mmid bash scripts/h200/mmid-op.sh" ;;
donor)
  [ -n "$DONOR" ] && { wait $DONOR; DONOR=""; }; tail -4 $B/donor-train.txt
  DW=/tmp/donor; TR=$R/scripts/train
  run donor-export 120 python3 $TR/export.py $DW/weights.pt --tokenizer $DW/tokenizer.json -o $DW/donor-f32.gguf --name moeslots-donor-qwen3-30b-a3b
  run donor-validate 120 python3 $TR/validate.py --weights $DW/weights.pt --tokenizer $DW/tokenizer.json --corpus $DW/corpus --f32 $DW/donor-f32.gguf --topology qwen3-30b-a3b --positions 128 --domains code,prose,chat --threads 16 --json $B/donor-validation.json
  run donor-record 300 python3 $TR/record_donor.py $DW/donor-f32.gguf $DW/corpus $B/donor
  cp $DW/train.log $B/donor-train.log 2>/dev/null ;;
v2)
  [ -n "$S3" ] && { wait $S3; tail -2 $B/synth-big.txt; S3=""; }
  for mem in mmap pinned; do
    NM=""; [ $mem = pinned ] && NM=--no-mmap
    run v2-prompt-$mem 120 $M bench decode /tmp/big.gguf --slots 0,64 -n 32 --prompt-len 512 --threads 16 $NM --json $B/v2-prompt-$mem.json
    run v2-prompt-$mem-cpu 90 $M bench decode /tmp/big.gguf --slots 64 -n 32 --prompt-len 512 --threads 16 $NM --no-op-offload --json $B/v2-prompt-$mem-cpu.json
  done
  run v2-full-stats 90 $M bench decode /tmp/big.gguf --slots 128 -n 128 --prompt-len 128 --threads 16 --json $B/v2-full-stats.json
  run v2-full-nostats 90 $M bench decode /tmp/big.gguf --slots 128 -n 128 --prompt-len 128 --threads 16 --no-stats --json $B/v2-full-nostats.json
  run v2-all-gpu 90 $M bench decode /tmp/big.gguf --all-gpu -n 128 --prompt-len 128 --threads 16 --no-stats --json $B/v2-all-gpu.json
  run v2-decode-pinned 150 $M bench repick /tmp/big.gguf --every 0 --slots 32,64,96 --replay uniform -n 64 --threads 16 --no-mmap --json $B/v2-decode-pinned.json
  run v2-decode-mmap 150 $M bench repick /tmp/big.gguf --every 0 --slots 32,64,96 --replay uniform -n 64 --threads 16 --json $B/v2-decode-mmap.json ;;
timing)    # where a decode token's time goes (patch 0006's clock): per layer the CPU split waits for the GPU, copies
           # its inputs, computes; the GPU splits copy theirs and launch. 127 slots: a host round trip per layer with
           # almost nothing to compute on the CPU (its cost alone); with OpenMP threads spinning, without CUDA graphs
  [ -n "$S3" ] && { wait $S3; tail -2 $B/synth-big.txt; S3=""; }
  run timing-pinned 200 $M bench decode /tmp/big.gguf --slots 0,64,96,127,128 -n 64 --prompt-len 64 --threads 16 --no-mmap --timing --json $B/timing-pinned.json
  run timing-spin 120 env OMP_WAIT_POLICY=active $M bench decode /tmp/big.gguf --slots 64,127 -n 64 --prompt-len 64 --threads 16 --no-mmap --timing --json $B/timing-spin.json
  run timing-nographs 120 env GGML_CUDA_DISABLE_GRAPHS=1 $M bench decode /tmp/big.gguf --slots 64,128 -n 64 --prompt-len 64 --threads 16 --no-mmap --timing --json $B/timing-nographs.json
  run timing-t6 120 $M bench decode /tmp/big.gguf --slots 64,127 -n 64 --prompt-len 64 --threads 6 --no-mmap --timing --json $B/timing-t6.json
  run timing-mmap 120 $M bench decode /tmp/big.gguf --slots 64 -n 64 --prompt-len 64 --threads 16 --timing --json $B/timing-mmap.json ;;
v2mtp)     # drafts 4-7 make verify batches of 5-8 tokens: the cache serves them (no zero slot)
  [ -n "$S1" ] && { wait $S1; S1=""; }
  run v2-mtp 150 $M bench mtp /tmp/mtp.gguf --drafts 1,4,7 --slots 0,64 -n 48 --threads 16 --replay uniform --json $B/v2-mtp.json ;;
donorbench)
  [ -n "$S3" ] && { wait $S3; S3=""; }
  D=$B/donor/moeslots-donor-qwen3-30b-a3b; [ -f $D-chat-sampled.npz ] || D=$R/profiles/data/moeslots-donor-qwen3-30b-a3b
  run donor-chat-pinned 200 $M bench repick /tmp/big.gguf --every 0,16 --policy static,hybrid,dynamic --slots 32,64 --replay $D-chat-sampled.npz --profile-from $D-chat-greedy.npz -n 192 --threads 16 --no-mmap --json $B/donor-chat-pinned.json
  run donor-code-mmap 200 $M bench repick /tmp/big.gguf --every 0,16 --policy static,hybrid,dynamic --slots 32,64 --replay $D-code-sampled.npz --profile-from $D-code-greedy.npz -n 192 --threads 16 --json $B/donor-code-mmap.json
  run donor-chat-t6 200 $M bench repick /tmp/big.gguf --every 0,16 --policy static,hybrid,dynamic --slots 32,64 --replay $D-chat-sampled.npz --profile-from $D-chat-greedy.npz -n 192 --threads 6 --no-mmap --json $B/donor-chat-t6.json ;;
esac
done
echo "== $(date +%T) done ($(left) s left)"
} 2>&1 | tee "$OUT/measure.txt"
