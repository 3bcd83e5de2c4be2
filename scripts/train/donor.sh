#!/usr/bin/env bash
# The routing donor, end to end: corpus (+ man pages and package docs) -> tokenizer -> train the
# Qwen3-30B-A3B expert topology (48 MoE blocks x 128 experts, 8 used, softmax router, normalised top-k; narrow
# trunk; NextN head) -> export glm4moe GGUF (F32) -> check that the GGUF routes as PyTorch does -> record traces.
# Fixed seed 0; each stage is skipped when its output exists and training resumes from WORK/ckpt.pt, so the
# command can be repeated in short runs.
#
#   scripts/train/donor.sh WORK [MINUTES] [cpu|cuda] [train-only]
#     cpu:  2 cores, nice'd, one torch thread: step 150 of a 300-step schedule (153,600 tokens), the donor of
#           docs/profiles.md (45 minutes on the shared, busy 2-core dev box; a fresh run stops at step 150 too)
#     cuda: the H200 box, bf16 autocast, batch 64 x 256 (the issue's <= 15 minutes); MAX_STEPS=N stops at step N
#           whatever the time left (the kept traces' donor: MAX_STEPS=381, on the dev box's corpus and tokenizer)
#
# Needs python3 with torch + tokenizers (+ gguf and the moeslots engine for export/validate/record): PY=... picks
# the interpreter. Writes WORK/{corpus/,tokenizer.json,tokens.npz,ckpt.pt,weights.pt,train.log,donor-f32.gguf,
# validation.json,traces/}.
set -euo pipefail
W=${1:?usage: donor.sh WORK [MINUTES] [cpu|cuda] [train-only]}
MIN=${2:-120}
DEV=${3:-cpu}
PY=${PY:-python3}
D=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$W"
[ -f "$W/corpus/manifest.json" ] || "$PY" "$D/corpus.py" --more "$W/corpus"
[ -f "$W/tokenizer.json" ] || "$PY" "$D/tok.py" "$W/corpus" -o "$W/tokenizer.json"
COMMON=(--corpus "$W/corpus" --tokenizer "$W/tokenizer.json" --out "$W" --minutes "$MIN" --topology qwen3-30b-a3b
        --mix code=0.34,prose=0.33,chat=0.33 --seed 0 --log-every 10 --save-every 120)
if [ "$DEV" = cuda ]; then
  "$PY" "$D/train.py" "${COMMON[@]}" --device cuda --batch 64 --seq 256 --lr 3e-3 --warmup 100 --steps 3000 \
    ${MAX_STEPS:+--max-steps "$MAX_STEPS"} 2>&1 | tee -a "$W/train.log"
else
  nice -n 10 "$PY" "$D/train.py" "${COMMON[@]}" --device cpu --threads 1 --batch 4 --seq 256 --lr 3e-3 --warmup 30 \
    --steps 300 --max-steps 150 2>&1 | tee -a "$W/train.log"
fi
[ "${4:-}" = train-only ] && exit 0
[ -f "$W/donor-f32.gguf" ] || "$PY" "$D/export.py" "$W/weights.pt" --tokenizer "$W/tokenizer.json" \
  -o "$W/donor-f32.gguf" --name moeslots-donor-qwen3-30b-a3b
[ -f "$W/validation.json" ] || "$PY" "$D/validate.py" --weights "$W/weights.pt" --tokenizer "$W/tokenizer.json" \
  --corpus "$W/corpus" --f32 "$W/donor-f32.gguf" --topology qwen3-30b-a3b --positions 128 --domains code,prose,chat \
  --threads "$(nproc)" --json "$W/validation.json"
"$PY" "$D/record_donor.py" "$W/donor-f32.gguf" "$W/corpus" "$W/traces"
