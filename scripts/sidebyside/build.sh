#!/usr/bin/env bash
# build.sh SRC_TAR BUILD_DIR [cpu|cuda]
#
# Builds llama-bench and llama-completion of llama.cpp b11549 from prepare.sh's llamacpp-b11549.tar.xz (checked
# against its .sha256 when that file sits beside it) into BUILD_DIR/build/bin. cuda: the CUDA backend for sm_90
# (the H200), flash attention kernels off; cpu (the default without nvcc): CPU only; AMX kernels compiled out, as
# in our engine. Prints the time taken.
# Environment: JOBS (default: nproc), TARGETS (default: "llama-bench llama-completion"), CMAKE_ARGS (extra flags).
set -euo pipefail

usage() { echo "usage: $0 SRC_TAR BUILD_DIR [cpu|cuda]" >&2; exit 2; }
die() { echo "build.sh: $*" >&2; exit 2; }
[[ $# -ge 2 && $# -le 3 ]] || usage
TAR=$1
DIR=$2
[[ -f $TAR ]] || die "source tarball not found: $TAR"
if [[ $# -eq 3 ]]; then
    BACKEND=$3
elif command -v nvcc >/dev/null || [[ -x /usr/local/cuda/bin/nvcc ]]; then
    BACKEND=cuda
else
    BACKEND=cpu
fi
[[ $BACKEND == cpu || $BACKEND == cuda ]] || usage
command -v cmake >/dev/null || die "cmake not found"
JOBS=${JOBS:-$(nproc)}
TARGETS=${TARGETS:-llama-bench llama-completion}

if [[ -f $TAR.sha256 ]]; then
    (cd "$(dirname "$TAR")" && sha256sum --quiet -c "$(basename "$TAR").sha256") || die "$TAR: sha256 mismatch"
fi

start=$(date +%s)
mkdir -p "$DIR"
SRC=$DIR/llamacpp-b11549
# the same tarball again (an incremental rebuild) keeps the extracted tree and its timestamps
sum=$(sha256sum "$TAR" | cut -d' ' -f1)
if [[ ! -f $DIR/source.sha256 || $(cat "$DIR/source.sha256") != "$sum" ]]; then
    rm -rf "$SRC" "$DIR/source.sha256"
    tar -xJmf "$TAR" -C "$DIR"   # -m: extraction time, so a changed tree rebuilds
    echo "$sum" > "$DIR/source.sha256"
fi
[[ -f $SRC/CMakeLists.txt ]] || die "$TAR is not prepare.sh's llamacpp-b11549 tarball"

flags=(-DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_NUMBER=11549 -DLLAMA_BUILD_COMMIT=b11549
       -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
       -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_COMMON=ON
       # ggml's AMX kernels crash on CPU-side Q8_0/Q4_K weights (upstream ggml-org/llama.cpp#20824); our engine
       # compiles them out too, and experts overridden to the CPU buffer never use them
       -DCMAKE_C_FLAGS=-U__AMX_INT8__ -DCMAKE_CXX_FLAGS=-U__AMX_INT8__)
if [[ $BACKEND == cuda ]]; then
    if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
        export PATH=/usr/local/cuda/bin:$PATH
    fi
    command -v nvcc >/dev/null || die "cuda: nvcc not found (PATH or /usr/local/cuda/bin)"
    flags+=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real -DGGML_CUDA_FA=OFF)
else
    flags+=(-DGGML_CUDA=OFF)
fi
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
# shellcheck disable=SC2086
cmake -S "$SRC" -B "$DIR/build" "${gen[@]}" "${flags[@]}" ${CMAKE_ARGS:-} > "$DIR/cmake.log" 2>&1 \
    || { tail -20 "$DIR/cmake.log" >&2; die "cmake configure failed (log: $DIR/cmake.log)"; }
# shellcheck disable=SC2086
cmake --build "$DIR/build" -j "$JOBS" --target $TARGETS
for t in $TARGETS; do
    [[ -x $DIR/build/bin/$t ]] || die "$t was not built"
done
end=$(date +%s)
echo "built $TARGETS ($BACKEND) in $DIR/build/bin in $((end - start)) s with $JOBS jobs"
