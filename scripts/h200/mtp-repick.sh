#!/usr/bin/env bash
# One H200 call for issues 6 and 10: CUDA build while the NextN synthetic models (random and const-head) are
# written; calibration; MTP benches (random, const-head, the bundled trained model); static vs re-pick under
# replayed real (bundled code/chat traces) and uniform routing. Carry .export and .whl (or .wheel: a CUDA wheel
# returned by an earlier call, then no build). MTP=0 / REPICK=0 skip those parts; MTP_HEADS="slots host gpu" measures
# where the NextN block's experts should live; ASYNC=1 measures patch 0008 (issue 7) on vs off.
# $OUT: mtp-repick.txt (log), bench.tgz (JSON + calibration), wheel.part-* (the built CUDA wheel, for reuse).
set -u
. "$(dirname "$0")/common.sh"
{
echo "== $(date +%T) machine"; nproc; nvidia-smi --query-gpu=name,memory.total,memory.free --format=csv,noheader
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | grep -v WARN
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site . 2>&1 | grep -v WARN
if ls .wheel/*.whl >/dev/null 2>&1; then
  echo "== $(date +%T) installing the carried engine wheel"
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .wheel/*.whl 2>&1 | grep -v WARN
  BUILD=""
else
  ( cd /tmp && time $M engine build --cuda --from-source "$R/.export/llama_cpp_python-0.3.36" > $B/build.txt 2>&1; echo "build rc $?" >> $B/build.txt ) &
  BUILD=$!
fi
( cd /tmp && time $M synth -o /tmp/mtp.gguf $G > $B/synth.txt 2>&1; echo "synth rc $?" >> $B/synth.txt ) &
S1=$!
if [ "${MTP:-1}" = 1 ]; then
( cd /tmp && time $M synth -o /tmp/mtpc.gguf $G --const-head > $B/synth-const.txt 2>&1; echo "synth rc $?" >> $B/synth-const.txt ) &
S2=$!
fi
[ -n "$BUILD" ] && { wait $BUILD; tail -3 $B/build.txt; }
W=$(ls -S ~/.cache/moeslots/wheels/*/*.whl 2>/dev/null | head -1)
if [ -n "$W" ] && [ "$(stat -c %s "$W")" -lt 60000000 ]; then
  ls -la "$W"; split -b 15m "$W" "$OUT/wheel.part-"; basename "$W" > "$OUT/wheel.name"
fi
cd /tmp
$M doctor | head -3
if [ "${DIAG:-0}" = 1 ]; then
echo "== $(date +%T) the bundled model on CUDA, configuration by configuration"
timeout 150 python3 -P $R/scripts/h200/diagnose_tiny.py 2>&1 | tee $B/diagnose.txt; pack
echo 'What does `json.dumps` do?' > /tmp/q.txt
timeout 60 $M bench $TINY --mtp 1,2,3 --slots 0,16 -n 128 --threads 16 --prompt-file /tmp/q.txt --json $B/mtp-tiny.json; pack
fi
if [ "${ASYNC:-0}" = 1 ]; then
wait $S1; tail -2 $B/synth.txt
echo "== $(date +%T) issue 7: host chain overlapping the GPU chain, on vs off (decode; prompt 512 must not drop)"
timeout 90 $M bench /tmp/mtp.gguf --slots 0,32,64,96 -n 64 --prompt-len 512 --threads 16 --greedy-prompts 0 --async-cpu --json $B/async-on.json; pack
timeout 90 $M bench /tmp/mtp.gguf --slots 0,32,64,96 -n 64 --prompt-len 512 --threads 16 --greedy-prompts 0 --no-async-cpu --json $B/async-off.json; pack
timeout 60 $M bench /tmp/mtp.gguf --mtp 1 --slots 32,64 -n 64 --threads 16 --mtp-head gpu --async-cpu --json $B/async-mtp-on.json; pack
timeout 60 $M bench /tmp/mtp.gguf --mtp 1 --slots 32,64 -n 64 --threads 16 --mtp-head gpu --no-async-cpu --json $B/async-mtp-off.json; pack
fi
if [ "${MTP:-1}" = 1 ]; then
echo "== $(date +%T) MTP on the bundled trained model (real acceptance)"
echo 'What does `json.dumps` do?' > /tmp/q.txt
timeout 60 $M bench $TINY --mtp 1,2,3 --slots 0,16 -n 128 --threads 16 --prompt-file /tmp/q.txt --json $B/mtp-tiny.json
fi
wait $S1; tail -2 $B/synth.txt
echo "== $(date +%T) calibration (uploads pinned/pageable, CPU expert rate, base)"
timeout 90 $M doctor --calibrate /tmp/mtp.gguf --threads 16 2>&1 | grep -v '^llama\|^load\|^print_info'; cp /tmp/cfg/moeslots/config.toml $B/calibration.toml; pack
if [ "${MTP:-1}" = 1 ]; then
echo "== $(date +%T) MTP, random NextN head"
for H in ${MTP_HEADS:-slots}; do
timeout 80 $M bench /tmp/mtp.gguf --mtp 1,2,3 --slots 0,64 -n 128 --threads 16 --mtp-head $H --json $B/mtp-random-$H.json; pack
done
wait $S2; tail -2 $B/synth-const.txt
echo "== $(date +%T) MTP, const head (full acceptance upper bound)"
for H in ${MTP_HEADS:-slots}; do
timeout 80 $M bench /tmp/mtpc.gguf --mtp 1,2,3 --slots 0,64 -n 128 --threads 16 --mtp-head $H --json $B/mtp-const-$H.json; pack
done
rm -f /tmp/mtpc.gguf
fi
if [ "${REPICK:-1}" = 1 ]; then
echo "== $(date +%T) static vs re-pick, pageable uploads (mmap), replayed code/chat traces and uniform"
timeout ${REPICK_S:-200} $M bench /tmp/mtp.gguf --repick 0,1,16,100 --slots ${REPICK_SLOTS:-19,32,64} --replay $P-code.csv,$P-chat.csv,uniform -n 256 --threads 16 --json $B/repick-mmap.json; pack
echo "== $(date +%T) the same, pinned uploads (no mmap), code trace"
timeout ${PINNED_S:-100} $M bench /tmp/mtp.gguf --repick 0,1,16,100 --slots ${REPICK_SLOTS:-19,32,64} --replay $P-code.csv -n 256 --threads 16 --no-mmap --json $B/repick-pinned.json; pack
fi
if [ "${STATS:-0}" = 1 ]; then
echo "== $(date +%T) stats cost, again (stats on first this time)"
timeout 45 $M bench /tmp/mtp.gguf --slots 0,64 -n 64 --prompt-len 128 --threads 16 --greedy-prompts 0 --json $B/stats-on.json
timeout 45 $M bench /tmp/mtp.gguf --slots 0,64 -n 64 --prompt-len 128 --threads 16 --greedy-prompts 0 --no-stats --json $B/stats-off.json; pack
fi
if [ "${OVERLAP:-0}" = 1 ]; then
echo "== $(date +%T) re-pick copies overlapping decode (patch 0011), pageable and pinned, code trace"
timeout ${OVERLAP_S:-120} $M bench /tmp/mtp.gguf --repick 0,1,16,100 --slots 32,64 --replay $P-code.csv -n 256 --threads 16 --overlap --json $B/repick-overlap-mmap.json; pack
timeout ${OVERLAP_S:-120} $M bench /tmp/mtp.gguf --repick 0,1,16,100 --slots 32,64 --replay $P-code.csv -n 256 --threads 16 --overlap --no-mmap --json $B/repick-overlap-pinned.json; pack
fi
echo "== $(date +%T) done"
} 2>&1 | tee "$OUT/mtp-repick.txt"
