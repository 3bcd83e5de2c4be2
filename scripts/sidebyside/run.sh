#!/usr/bin/env bash
# run.sh MODEL.gguf LLAMA_BENCH [options]
#
# llama.cpp b11549 (its dynamic expert cache, --moe-cache-mib) and moeslots (bench repick: static, hybrid, dynamic,
# auto) on one GGUF, experts in host memory, the same cache bytes: S slots per MoE layer for moeslots is
# S x slab bytes x MoE layers MiB for llama.cpp. For each load mode x thread count x routing:
#   llama-bench -ngl 99 -ot exps=CPU -fa 0 -p 512 -n N -r R -o json -lm none|mmap -t T --moe-cache-mib 0,MiB1,...
#   moeslots bench repick MODEL --every 0 --policy ... --slots S1,... --replay ... [--no-mmap] --threads T -n N -r R
# then table.py writes OUT/sidebyside.json and OUT/sidebyside.md (both engines side by side, ratio per cell).
#
# Options (defaults in brackets):
#   --out DIR            results [sidebyside-out]
#   --slots S1,S2        slots per MoE layer [32,64]
#   --threads T1,T2      [16,6]
#   --load L1,L2         pinned (llama.cpp -lm none, moeslots --no-mmap) and/or mmap [pinned,mmap]
#   --routing R1,R2      random: llama.cpp routes random tokens itself, moeslots replays uniform random rows;
#                        uniform: both replay the same uniform random rows; a trace (csv/npz): both replay it
#                        [random]
#   --policies P1,P2     moeslots policies [default,static,hybrid,dynamic,fetch,fetch-split] (fetch, fetch-split:
#                        pinned cells only; default: what `moeslots chat` does with no --policy, from a config of
#                        this run that starts empty: the first-run calibration, then auto)
#   -n N / -p N / -r N   decode tokens (both engines), llama-bench prompt tokens, repetitions (both engines: moeslots
#                        takes the median of its repetitions, the policies taking turns) [64 / 512 / 2]
#   --profile-rows N     routing rows that plan moeslots' slots (bench repick --profile-rows) [1024]
#   --llama-args "A B"   more llama-bench flags, e.g. "--repack 0" (no repacked CPU weights)
#   --dry-run            print the commands only
# Environment: PYTHON (a python that imports moeslots) [.venv/bin/python if present, else python3]; PACK_HOST=1
# passes --pack-host to moeslots (automatic without an NVIDIA GPU: its slots then live in host memory).
set -euo pipefail

usage() { sed -n 2,2p "$0" | sed 's/^# /usage: /' >&2; echo "(options: $0 --help)" >&2; exit 2; }
if [[ ${1:-} == -h || ${1:-} == --help ]]; then sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0; fi
die() { echo "run.sh: $*" >&2; exit 2; }
[[ $# -ge 2 ]] || usage
MODEL=$1
BENCH=$2
shift 2
[[ -f $MODEL ]] || die "model not found: $MODEL"
[[ -x $BENCH ]] || die "llama-bench not found or not executable: $BENCH (build it with build.sh)"

OUT=sidebyside-out SLOTS=32,64 THREADS=16,6 LOADS=pinned,mmap ROUTINGS=random
POLICIES=default,static,hybrid,dynamic,fetch,fetch-split NGEN=64 NPROMPT=512 REPS=2 PROFILE_ROWS=1024 DRY=0 LLAMA_ARGS=() FAILED=0
while [[ $# -gt 0 ]]; do
    case $1 in
        --out) OUT=$2; shift 2 ;;
        --slots) SLOTS=$2; shift 2 ;;
        --threads) THREADS=$2; shift 2 ;;
        --load) LOADS=$2; shift 2 ;;
        --routing) ROUTINGS=$2; shift 2 ;;
        --policies) POLICIES=$2; shift 2 ;;
        -n) NGEN=$2; shift 2 ;;
        -p) NPROMPT=$2; shift 2 ;;
        -r) REPS=$2; shift 2 ;;
        --profile-rows) PROFILE_ROWS=$2; shift 2 ;;
        --llama-args) read -r -a LLAMA_ARGS <<<"$2"; shift 2 ;;
        --dry-run) DRY=1; shift ;;
        *) die "unknown option: $1" ;;
    esac
done

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
if [[ -z ${PYTHON:-} ]]; then
    if [[ -x $ROOT/.venv/bin/python ]]; then PYTHON=$ROOT/.venv/bin/python; else PYTHON=python3; fi
fi
"$PYTHON" -P -c "import moeslots.engine" 2>/dev/null || die "$PYTHON cannot import moeslots (set PYTHON or PYTHONPATH)"
M=("$PYTHON" -P -m moeslots)
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)
PACK=()
if [[ ${PACK_HOST:-} == 1 || -z $GPU ]]; then PACK=(--pack-host); fi

mkdir -p "$OUT/raw"
OUT=$(cd "$OUT" && pwd)
# moeslots starts from an empty config (no calibration, no settings): what a new user has; the first-run
# calibrations its "default" rows make are kept there for the run's later cells (each is per thread count and memory)
rm -rf "$OUT/config"; mkdir -p "$OUT/config"; export XDG_CONFIG_HOME=$OUT/config
RAW=$OUT/raw
MANIFEST=$OUT/manifest.jsonl
: > "$MANIFEST"

IFS=, read -r -a slots <<<"$SLOTS"
IFS=, read -r -a threads <<<"$THREADS"
IFS=, read -r -a loads <<<"$LOADS"
IFS=, read -r -a routings <<<"$ROUTINGS"
for l in "${loads[@]}"; do [[ $l == pinned || $l == mmap ]] || die "--load takes pinned,mmap, not $l"; done
for r in "${routings[@]}"; do
    [[ $r == random || $r == uniform || -f $r ]] || die "routing is random, uniform or a trace file: $r not found"
done

"$PYTHON" -P "$HERE/replay_table.py" facts "$MODEL" --slots "$SLOTS" > "$OUT/facts.json" \
    || die "cannot read the model's shape: $MODEL"
mibs=$("$PYTHON" -P -c 'import json,sys; d=json.load(open(sys.argv[1])); print(",".join(["0"]+[str(d["cache_mib"][s]) for s in sys.argv[2].split(",")]))' "$OUT/facts.json" "$SLOTS")
echo "model: $("$PYTHON" -P -c 'import json,sys; print(json.load(open(sys.argv[1]))["shape"])' "$OUT/facts.json")"
echo "slots $SLOTS per MoE layer = --moe-cache-mib ${mibs#0,} (0: no cache)"
if "$BENCH" --list-devices 2>/dev/null | grep -q "(none)"; then
    # llama.cpp refuses a context with --moe-cache-mib > 0 and no GPU backend
    echo "note: $BENCH has no GPU device: llama.cpp is measured without its expert cache"
    mibs=0
fi

# one name per routing: the label in the table, the replay table llama.cpp reads (none: its own router), the
# routing moeslots replays
declare -A TABLE REPLAY
names=()
for r in "${routings[@]}"; do
    case $r in
        random) name=random; TABLE[$name]=""; REPLAY[$name]=uniform ;;
        uniform) name=uniform; TABLE[$name]=$RAW/uniform.mrp1; REPLAY[$name]=uniform ;;
        *) name=$(basename "${r%.*}"); TABLE[$name]=$RAW/$name.mrp1; REPLAY[$name]=$(cd "$(dirname "$r")" && pwd)/$(basename "$r") ;;
    esac
    names+=("$name")
    if [[ -n ${TABLE[$name]} ]]; then
        "$PYTHON" -P "$HERE/replay_table.py" write "$MODEL" "${REPLAY[$name]}" "${TABLE[$name]}" \
            --profile-rows "$PROFILE_ROWS" -n "$NGEN" --rows "$((NPROMPT > NGEN ? NPROMPT : NGEN))"
    fi
done
replays=$(printf '%s\n' "${names[@]}" | while read -r n; do echo "${REPLAY[$n]}"; done | awk '!seen[$0]++' | paste -sd,)

note() {   # manifest line: engine, load, threads, routing label ("" for moeslots: all), result file, command
    "$PYTHON" -P -c 'import json,sys; print(json.dumps(dict(zip(["engine","load","threads","routing","json","cmd"], sys.argv[1:]))))' "$@" >> "$MANIFEST"
}
go() {     # LOG CMD...: run (or print) one command, its stderr to LOG
    local log=$1; shift
    echo "+ $*" >&2
    [[ $DRY == 1 ]] && return 0
    local t0=$SECONDS
    "$@" 2> "$log" || { tail -5 "$log" >&2; echo "run.sh: failed, going on (log: $log): $*" >&2; FAILED=1; return 1; }
    echo "  ($((SECONDS - t0)) s)" >&2
}

for load in "${loads[@]}"; do
    lm=none; mm=(--no-mmap)
    if [[ $load == mmap ]]; then lm=mmap; mm=(); fi
    for t in "${threads[@]}"; do
        for name in "${names[@]}"; do
            res=$RAW/llama-$load-t$t-$name.json
            cmd=("$BENCH" -m "$MODEL" -ngl 99 -ot exps=CPU -fa 0 -p "$NPROMPT" -n "$NGEN" -r "$REPS" -o json
                 -lm "$lm" -t "$t" --moe-cache-mib "$mibs" "${LLAMA_ARGS[@]}")
            env=()
            [[ -n ${TABLE[$name]} ]] && env=(env "LLAMA_MOE_REPLAY=${TABLE[$name]}")
            note llama.cpp "$load" "$t" "$name" "$res" "${env[*]:+${env[*]} }${cmd[*]}"
            if [[ $DRY == 1 ]]; then go /dev/null "${env[@]}" "${cmd[@]}"; continue; fi
            go "${res%.json}.log" "${env[@]}" "${cmd[@]}" > "$res" || continue
            if [[ -n ${TABLE[$name]} ]] && ! grep -q "^llama_moe_replay: " "${res%.json}.log"; then
                die "$BENCH ignored LLAMA_MOE_REPLAY: build it from prepare.sh's patched source"
            fi
        done
        res=$RAW/moeslots-$load-t$t.json
        pol=$POLICIES   # fetch, fetch-split read pinned memory: not with mmap'ed experts on a GPU (their cells show "–")
        if [[ $load == mmap && ${#PACK[@]} -eq 0 ]]; then
          pol=$(echo ",$POLICIES," | sed 's/,fetch-split,/,/g; s/,fetch,/,/g; s/^,//; s/,$//')
        fi
        [[ -n $pol ]] || continue
        cmd=("${M[@]}" bench repick "$MODEL" --every 0 --policy "$pol" --slots "$SLOTS" --replay "$replays"
             --threads "$t" -n "$NGEN" -r "$REPS" --profile-rows "$PROFILE_ROWS" "${mm[@]}" "${PACK[@]}" --json "$res")
        note moeslots "$load" "$t" "" "$res" "${cmd[*]}"
        if [[ $DRY == 1 ]]; then go /dev/null "${cmd[@]}"; else go "${res%.json}.log" "${cmd[@]}" > "${res%.json}.out" || true; fi
    done
done
[[ $DRY == 1 ]] && exit 0
"$PYTHON" -P "$HERE/table.py" "$OUT"
[[ $FAILED == 0 ]] || die "some runs failed: the table leaves them out (their logs are in $RAW)"
