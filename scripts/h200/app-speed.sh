#!/usr/bin/env bash
# The app against the engine alone on the H200 box: `moeslots bench app` (the real app driven headless,
# 160x48, beside the same Engine without it: same model, slots, threads, MTP setting) on the big synthetic glm4moe +
# NextN of common.sh ($G: 48 layers, 128 experts, 8 used, Q4_K), 64 slots per layer, MTP off, on (adaptive: drafting
# goes off below the measured break-even) and always, at the app's default threads (physical cores minus one) and at
# 16, 14 and 12 (an earlier run found one spare core too few at ~14 ms per token). Done when the app is >= 95 % of
# the engine in every row at the default threads.
# Needs the CUDA engine installed (`moeslots doctor` says patched; scripts/h200/first-run.sh installs one). From the
# repository root:
#   bash scripts/h200/app-speed.sh MODEL [PROFILE]
# MODEL is written with `moeslots synth -o MODEL $G` when missing; PROFILE (a routing trace of MODEL) is recorded when
# not given. THREADS="default 16 14 12", N=128 (tokens per reply), REPLIES=5 override the runs.
# $OUT: app-speed.txt (log and table), bench.tgz (a JSON per row, the recorded profile).
set -u
. "$(dirname "$0")/common.sh"
MODEL=${1:-/tmp/mtp.gguf}; PROFILE=${2:-}
THREADS=${THREADS:-"default 16 14 12"}; N=${N:-128}; REPLIES=${REPLIES:-5}
{
echo "== $(date +%T) machine"; nproc; nvidia-smi --query-gpu=name,memory.total,memory.free --format=csv,noheader
cd /tmp
$M doctor | head -4
[ -f "$MODEL" ] || { echo "== $(date +%T) writing $MODEL"; time $M synth -o "$MODEL" $G; }
if [ -z "$PROFILE" ]; then
  PROFILE=$B/app-speed-profile.csv
  echo 'Explain, step by step, how a fixed set of experts per layer in GPU memory speeds up decoding.' \
    > /tmp/app-speed-prompt.txt
  echo "== $(date +%T) recording a profile of $MODEL (256 decode tokens)"
  time $M record "$MODEL" --prompt-file /tmp/app-speed-prompt.txt -n 256 -o "$PROFILE" --threads 16
fi
for T in $THREADS; do
  TF=""; [ "$T" = default ] || TF="--threads $T"
  for MODE in off auto always; do
    case $MODE in off) MF=--no-mtp ;; auto) MF="" ;; always) MF=--mtp-always ;; esac
    echo "== $(date +%T) bench app: 64 slots, MTP $MODE, threads $T"
    time timeout 600 $M bench app "$MODEL" --slots 64 --profile "$PROFILE" $MF $TF -n "$N" --replies "$REPLIES" \
      --json "$B/app-$T-$MODE.json"
    pack
  done
done
echo "== $(date +%T) table (decode tok/s as the engine reports them, median of $REPLIES replies of up to $N tokens)"
python3 - "$B" <<'PY'
import json, sys
from pathlib import Path
print("| threads | MTP | engine alone | in the app | app / engine | same text | UI thread busy | MTP state after |")
print("|---|---|---|---|---|---|---|---|")
rows = [(json.loads(p.read_text()), p.stem.split("-")[-1]) for p in Path(sys.argv[1]).glob("app-*.json")]
for r, mode in sorted(rows, key=lambda rm: (rm[0]["threads"], ["off", "auto", "always"].index(rm[1]))):
    print(f"| {r['threads']} | {mode} | {r['engine_median']:.1f} | {r['app_median']:.1f} | {100 * r['ratio']:.0f} % | "
          f"{'yes' if r['same_text'] else 'NO'} | {100 * r['app']['ui_busy']:.0f} % | {r.get('mtp_line') or '-'} |")
PY
} 2>&1 | tee "$OUT/app-speed.txt"
