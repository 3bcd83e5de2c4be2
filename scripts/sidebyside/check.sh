#!/usr/bin/env bash
# check.sh BUILD_DIR MODEL.gguf [WORK_DIR]
#
# Checks the routing-replay hook of a build.sh tree (CPU; any MoE GGUF llama.cpp runs): compiles replay_check.cpp
# against BUILD_DIR, then runs it three times on the same tokens —
#   1. the router alone: logits, and the router's own picks written as a replay table;
#   2. LLAMA_MOE_REPLAY=those picks: the logits must be identical (difference 0);
#   3. LLAMA_MOE_REPLAY=every pick moved to the next expert: the logits must differ.
set -euo pipefail

usage() { echo "usage: $0 BUILD_DIR MODEL.gguf [WORK_DIR]" >&2; exit 2; }
die() { echo "check.sh: $*" >&2; exit 2; }
[[ $# -ge 2 && $# -le 3 ]] || usage
BUILD=$1
MODEL=$2
WORK=${3:-$(mktemp -d)}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SRC=$BUILD/llamacpp-b11549
LIB=$BUILD/build/bin
[[ -f $SRC/include/llama.h ]] || die "no llama.cpp source in $SRC (run build.sh first)"
[[ -f $LIB/libllama.so ]] || die "no libllama.so in $LIB (run build.sh first)"
[[ -f $MODEL ]] || die "model not found: $MODEL"
mkdir -p "$WORK"
CXX=${CXX:-c++}
command -v "$CXX" >/dev/null || die "no C++ compiler ($CXX)"

libs=(-lllama)
for l in "$LIB"/libggml*.so; do
    n=$(basename "$l" .so)
    libs+=("-l${n#lib}")
done
"$CXX" -std=c++17 -O2 -o "$WORK/replay_check" "$HERE/replay_check.cpp" -I"$SRC/include" -I"$SRC/ggml/include" \
    -L"$LIB" "${libs[@]}" -Wl,-rpath,"$(cd "$LIB" && pwd)"

run() { "$WORK/replay_check" "$MODEL" "$@"; }
echo "1. the router's own routing"
run "$WORK/router.f32" --table "$WORK/router.mrp1"
echo "2. replaying the router's picks"
out=$(LLAMA_MOE_REPLAY="$WORK/router.mrp1" run "$WORK/same.f32" --ref "$WORK/router.f32" 2>&1) || { echo "$out"; exit 1; }
echo "$out"
grep -q "llama_moe_replay: .* rows x" <<<"$out" || die "the hook did not say that it loaded the table"
grep -q "difference| against .*: 0$" <<<"$out" || die "replaying the router's own picks changed the logits"
echo "3. replaying other experts"
out=$(LLAMA_MOE_REPLAY="$WORK/router.mrp1.shifted" run "$WORK/other.f32" --ref "$WORK/router.f32" 2>&1) \
    || { echo "$out"; exit 1; }
echo "$out"
grep -q "difference| against .*: 0$" <<<"$out" && die "replaying other experts did not change the logits"
echo "replay hook OK: the router's own picks give identical logits, other picks change them"
