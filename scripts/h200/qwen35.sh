#!/usr/bin/env bash
# The qwen35moe table on the H200 box: a synthetic model of Qwen3.6-35B-A3B's shape (40 hybrid layers: gated
# delta-net with full attention every 4th, 256 experts, 8 used + a shared expert, n_embd 2048, expert FFN 512, NextN
# block; Q4_K experts), measured as
#   1. stock experts-on-CPU (0 slots) and the cache at 124 of 256 slots, experts in pinned host memory, random-token
#      routing (uniform ids replayed; the plan from 1,024 other rows: out of sample);
#   2. cache + MTP at draft 1 with the same routing, twice: the random model's own NextN head (it agrees with the
#      trunk on ~0 % of tokens: MTP's cost without its gain) and a constant-logit twin (every draft accepted: MTP's
#      gain at 100 %); a trained model lands between the two;
#   3. the app itself, headless, five chat turns on the model (MTP on), which must not fail.
# moeslots and the CUDA engine must be installed (scripts/h200/first-run.sh does both). From the repository root:
#   bash scripts/h200/qwen35.sh [MODEL_DIR] [STEPS]      (STEPS: any of "bench mtp app", default all)
set -uo pipefail
DIR=${1:-/tmp}; STEPS=${2:-"bench mtp app"}
OUT=${OUT:-/tmp/qwen35}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TIMEFORMAT="wall %R s" XDG_CONFIG_HOME=${XDG_CONFIG_HOME:-/tmp/cfg}
M="python3 -P -m moeslots"
SHAPE="--arch qwen35moe --layers 40 --n-embd 2048 --heads 16 --kv-heads 2 --head-dim 256 --rope-dim 64 --experts 256
 --experts-used 8 --expert-ff 512 --shexp-ff 512 --ssm-state 128 --ssm-groups 16 --ssm-v-heads 32 --vocab 248320
 --quant q4_k --no-check"
Q=$DIR/qwen35-35b-a3b-shape.gguf; C=$DIR/qwen35-35b-a3b-shape-const.gguf
log() { echo "== $(date +%T) $*"; }
synth() { [ -f "$1" ] || { log "writing $1"; time $M synth -o "$1.part.gguf" $SHAPE "${@:2}" && mv "$1.part.gguf" "$1"; }; }
{
synth "$Q"
for step in $STEPS; do
case $step in
bench)
  log "stock vs 124 slots, pinned, uniform routing"
  time $M bench repick "$Q" --every 0 --slots 0,124 --replay uniform -n 128 --threads 16 --no-mmap --json "$OUT/slots.json" ;;
mtp)
  log "cache + MTP, random head"
  time $M bench mtp "$Q" --drafts 1 --slots 124 --replay uniform -n 128 --threads 16 --no-mmap --json "$OUT/mtp-random.json"
  synth "$C" --const-head
  log "cache + MTP, constant head (every draft accepted)"
  time $M bench mtp "$C" --drafts 1 --slots 124 --replay uniform -n 128 --threads 16 --no-mmap --json "$OUT/mtp-const.json"
  rm -f "$C" ;;
app)
  log "the app, five turns"
  time python3 -P scripts/chat_turns.py "$Q" --turns 5 --slots 124 --threads 16 --json "$OUT/app-turns.json" ;;
esac
done
log done
} 2>&1 | tee "$OUT/qwen35.txt"
