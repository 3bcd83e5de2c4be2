#!/usr/bin/env bash
# The bundled model, end to end, on the H200 box (no internet needed): corpus -> tokenizer -> train -> export ->
# validate. Every stage that already has its output is skipped and training resumes from WORK/ckpt.pt, so the
# command can be repeated in short runs (MINUTES each) until the model is good enough.
#
#   scripts/train/run.sh WORK [MINUTES] [train-only]
#
# Needs python3 with torch + tokenizers (+ gguf, and the moeslots engine installed for export/validate).
# Writes WORK/{corpus/,tokenizer.json,tokens.npz,ckpt.pt,weights.pt,train.log,model-f32.gguf,model.gguf,
# validation.json}.
set -euo pipefail
W=${1:?usage: run.sh WORK [MINUTES] [train-only]}
MIN=${2:-8}
D=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$W"
[ -f "$W/corpus/manifest.json" ] || python3 "$D/corpus.py" "$W/corpus"
[ -f "$W/tokenizer.json" ] || python3 "$D/tok.py" "$W/corpus" -o "$W/tokenizer.json"
python3 "$D/train.py" --corpus "$W/corpus" --tokenizer "$W/tokenizer.json" --out "$W" --minutes "$MIN" \
  2>&1 | tee -a "$W/train.log"
[ "${3:-}" = train-only ] && exit 0
python3 "$D/export.py" "$W/weights.pt" --tokenizer "$W/tokenizer.json" -o "$W/model-f32.gguf" \
  --quant mix --quant-out "$W/model.gguf"
python3 "$D/validate.py" --weights "$W/weights.pt" --tokenizer "$W/tokenizer.json" --corpus "$W/corpus" \
  --f32 "$W/model-f32.gguf" --quant "$W/model.gguf" --threads "$(nproc)" --json "$W/validation.json"
