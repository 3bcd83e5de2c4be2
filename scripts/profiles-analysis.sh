#!/usr/bin/env bash
# Reproduces docs/profiles.md: record code and chat traces (train + held-out test) on a model, merge, show, and
# simulate specialist / wrong-workload / merged plans and the dynamic policies at 25 % and 50 % of experts.
# Usage: scripts/profiles-analysis.sh MODEL.gguf OUTDIR [temperature]   (run from the repo root, venv active)
set -euo pipefail
MODEL=$1; OUT=$2; TEMP=${3:-1.0}
M="python -m moeslots"
mkdir -p "$OUT"
head -c 6000 engine/build.py      > "$OUT/code.txt"
head -c 6000 profiles/simulate.py > "$OUT/code2.txt"
head -c 6000 README.md            > "$OUT/chat.txt"
head -c 6000 docs/engine-build.md > "$OUT/chat2.txt"
$M record "$MODEL" --prompt-file "$OUT/code.txt"  -n 500 -o "$OUT/code.csv"      --temperature "$TEMP" --seed 0
$M record "$MODEL" --prompt-file "$OUT/chat.txt"  -n 500 -o "$OUT/chat.csv"      --temperature "$TEMP" --seed 1
$M record "$MODEL" --prompt-file "$OUT/code2.txt" -n 500 -o "$OUT/code-test.csv" --temperature "$TEMP" --seed 2
$M record "$MODEL" --prompt-file "$OUT/chat2.txt" -n 500 -o "$OUT/chat-test.csv" --temperature "$TEMP" --seed 3
E=$(grep -o 'n_expert=[0-9]*' "$OUT/code.csv" | head -1 | cut -d= -f2)
$M profile merge "$OUT/code.csv" "$OUT/chat.csv" -o "$OUT/merged.csv" --slots $((E / 4))
$M profile show "$OUT/code.csv" --slots $((E / 4)) --against "$OUT/chat.csv" --width 32
for S in $((E / 4)) $((E / 2)); do
  for test in code-test chat-test; do
    for train in code chat merged; do
      echo "== slots $S, test $test, plan trained on $train"
      $M simulate "$OUT/$test.csv" --slots "$S" --train "$OUT/$train.csv" | tail -n +4
    done
  done
done
