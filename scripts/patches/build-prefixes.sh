#!/usr/bin/env bash
# Every prefix of the patch series compiles: llama.cpp (the llama library and ggml) is built stock, then after each
# patch of engine/patches in turn (0001, then 0001+0002, ...), so that each patch stands on the ones before it and
# none leans on a later one. After the first full build each step recompiles what its patch touched. Run it before
# changing the series (not in CI: the first build is minutes). From the repository root, after `make engine`:
#   bash scripts/patches/build-prefixes.sh [--cuda] [JOBS]
# Prints one line per step (builds / FAILS with the compiler's last lines) and exits 1 at the first failure.
set -euo pipefail
R=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PYTHON:-$R/.venv/bin/python}
CUDA=OFF
if [ "${1:-}" = --cuda ]; then CUDA=ON; shift; fi
JOBS=${1:-$(nproc)}
W=$(mktemp -d /tmp/moeslots-prefixes.XXXXXX)
trap 'rm -rf "$W"' EXIT
SDIST=$("$PY" -c "from moeslots.engine.build import source, wheel; print(source.fetch_sdist(wheel.cache_root()))")
tar xzf "$SDIST" -C "$W"
T=$(ls -d "$W"/llama_cpp_python-*)
L="$T/vendor/llama.cpp"
configure() {
  cmake -S "$L" -B "$W/build" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=$CUDA -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF \
    > "$W/cmake.log" 2>&1 || { echo "cmake FAILS:"; tail -20 "$W/cmake.log"; exit 1; }
}
step() {   # $1: the step's name
  local t0=$SECONDS
  configure                                   # a patch may add source files: configure again
  if cmake --build "$W/build" -j "$JOBS" --target llama > "$W/step.log" 2>&1; then
    echo "$1: builds ($(( SECONDS - t0 )) s)"
  else
    echo "$1: FAILS"; grep -E "error|Error" "$W/step.log" | head -20; exit 1
  fi
}
echo "llama.cpp from $(basename "$SDIST"), CUDA $CUDA, $JOBS jobs"
step "stock"
for p in "$R"/engine/patches/[0-9]*.patch; do
  patch -p1 --forward --batch --no-backup-if-mismatch -d "$T" -i "$p" > /dev/null \
    || { echo "$(basename "$p"): does not apply"; exit 1; }
  step "+ $(basename "$p")"
done
