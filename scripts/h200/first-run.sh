#!/usr/bin/env bash
# First run on the H200 box, without internet. From the repository root:
#
#   bash scripts/h200/first-run.sh SOURCE_DIR MODEL.gguf [N_TOKENS]
#
# SOURCE_DIR  the patched source written on a machine with internet by
#             `moeslots engine build --export-source SOURCE_DIR` (the folder holding MOESLOTS_SOURCE.json)
# MODEL.gguf  a big synthetic model; written here first when the file does not exist (the realistic
#             glm4moe shape of docs/performance.md: 48 layers, 128 experts, 8 used, Q4_K, NextN block)
# N_TOKENS    decode tokens per session (default 256)
#
# It shows:
#  1. `moeslots engine build --from-source SOURCE_DIR` with neither --cuda nor --cpu builds the CUDA engine by
#     itself, and says why (the line is checked);
#  2. `moeslots doctor` on it (no "CPU-only" warning expected);
#  3. scripts/firstrun.py: the no-profile chat path headless (slots planned from the first prompt, profile saved)
#     against the next session, which must start with the saved profile, and a no-slots reference; decode tok/s of
#     each on the model's own greedy text, and their ratio (expected >= 0.90).
#
# moeslots must be importable by python3; when it is not, it is installed from this checkout into $SITE
# (default /tmp/site), its dependencies from the wheels in $WHEELS (a folder, for a machine without internet).
# Logs and the JSON go to $OUT (default /tmp/first-run).
set -euo pipefail
SRC=${1:?usage: first-run.sh SOURCE_DIR MODEL.gguf [N_TOKENS]}
MODEL=${2:?usage: first-run.sh SOURCE_DIR MODEL.gguf [N_TOKENS]}
N=${3:-256}
SRC=$(realpath "$SRC"); MODEL=$(realpath -m "$MODEL")
OUT=${OUT:-/tmp/first-run}; mkdir -p "$OUT"
SITE=${SITE:-/tmp/site}
export PYTHONUNBUFFERED=1 TIMEFORMAT="wall %R s"
log() { echo "== $(date +%T) $*"; }

if ! python3 -P -c "import moeslots" 2>/dev/null; then
  log "installing moeslots into $SITE"
  if [ -n "${WHEELS:-}" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$WHEELS"/*.whl
  fi
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --target "$SITE" .
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
M="python3 -P -m moeslots"       # -P: the checkout's moeslots/ folder must not shadow the installed package

{
log "machine"
nproc; free -g | head -2
nvidia-smi --query-gpu=name,compute_cap,memory.total,memory.free --format=csv,noheader || true
command -v nvcc || ls -l /usr/local/cuda/bin/nvcc || true

log "engine build, no backend flag"
( cd /tmp && time $M engine build --from-source "$SRC" ) 2>&1 | tee "$OUT/build.txt"
if grep -q "building the CUDA engine" "$OUT/build.txt"; then
  echo "OK: the build picked CUDA by itself"
else
  echo "FAIL: the build did not pick CUDA by itself"; exit 1
fi
log "doctor"
( cd /tmp && $M doctor ) | tee "$OUT/doctor.txt"

if [ ! -f "$MODEL" ]; then
  log "writing the synthetic model $MODEL"
  time $M synth -o "$MODEL.part" --arch glm4moe --layers 48 --n-embd 2048 --heads 32 --kv-heads 4 --head-dim 128 \
    --experts 128 --experts-used 8 --expert-ff 768 --ff 4096 --vocab 151936 --quant q4_k --threads "$(nproc)" \
    --no-check
  mv "$MODEL.part" "$MODEL"
fi
log "models found (the picker's list)"
( cd "$(dirname "$MODEL")" && $M models ) || true

log "first run: no profile vs the next session with the saved profile ($N decode tokens each)"
# routing: the bundled chat trace replayed, each session through its own rows (REPLAY= for the model's own text,
# which on a random-weight model repeats itself and flatters any cache)
REPLAY=${REPLAY-profiles/data/moeslots-tiny-glm4moe-chat.csv}
time python3 -P scripts/firstrun.py "$MODEL" -n "$N" --threads "$(nproc)" ${REPLAY:+--replay "$REPLAY"} \
  --json "$OUT/firstrun.json"
} 2>&1 | tee "$OUT/first-run.txt"
