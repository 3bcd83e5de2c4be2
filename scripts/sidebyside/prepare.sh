#!/usr/bin/env bash
# prepare.sh OUT_DIR [SDIST.tar.gz]
#
# On a machine with internet: download PyPI's xllamacpp==2026.10.11549 sdist (its thirdparty/llama.cpp is llama.cpp
# b11549), keep only what building llama-bench and llama-completion with the CPU and CUDA backends needs, apply
# scripts/sidebyside/patches/*.patch and write OUT_DIR/llamacpp-b11549.tar.xz and its .sha256. A machine without
# internet gets the source as that one file (build.sh builds it). Pass SDIST.tar.gz to skip the download.
set -euo pipefail

usage() { echo "usage: $0 OUT_DIR [SDIST.tar.gz]" >&2; exit 2; }
die() { echo "prepare.sh: $*" >&2; exit 2; }
[[ $# -ge 1 && $# -le 2 ]] || usage

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PKG=xllamacpp==2026.10.11549
SDIST_SHA256=c17ee1163006f70726abb9f72137830818f3d8cb60bfc34cb232d08428eaa22b
NAME=llamacpp-b11549
OUT=$1
mkdir -p "$OUT" || die "cannot create $OUT"
OUT=$(cd "$OUT" && pwd)
for tool in tar xz patch sha256sum; do command -v $tool >/dev/null || die "$tool not found"; done

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

if [[ $# -eq 2 ]]; then
    [[ -f $2 ]] || die "sdist not found: $2"
    SDIST=$2
else
    PY=${PYTHON:-python3}
    echo "downloading the $PKG sdist"
    # --no-build-isolation: pip still prepares the metadata, but from the sdist only (no build dependencies built)
    "$PY" -m pip download --quiet --no-deps --no-binary :all: --no-build-isolation "$PKG" -d "$WORK/dl" \
        || "$PY" -m pip download --quiet --no-deps --no-binary :all: "$PKG" -d "$WORK/dl" \
        || die "pip download $PKG failed (internet, or pip, missing?)"
    SDIST=$(ls "$WORK"/dl/xllamacpp-*.tar.gz)
fi
got=$(sha256sum "$SDIST" | cut -d' ' -f1)
[[ $got == "$SDIST_SHA256" ]] || die "$SDIST: sha256 $got, expected $SDIST_SHA256"

echo "extracting thirdparty/llama.cpp"
tar -xzf "$SDIST" -C "$WORK" --wildcards '*/thirdparty/llama.cpp/*'
FULL=$(echo "$WORK"/xllamacpp-*/thirdparty/llama.cpp)
[[ -f $FULL/CMakeLists.txt ]] || die "$SDIST has no thirdparty/llama.cpp"
SRC=$WORK/$NAME
mkdir -p "$SRC"

# what the build reads: the libraries (ggml, llama, common), their vendored headers and two tools
for p in CMakeLists.txt LICENSE licenses cmake include src common ggml/CMakeLists.txt ggml/cmake ggml/include \
         vendor/nlohmann vendor/sheredom vendor/cpp-httplib tools/llama-bench tools/completion; do
    mkdir -p "$SRC/$(dirname "$p")"
    cp -a "$FULL/$p" "$SRC/$p"
done
# ggml: the core and two backends (CPU, CUDA); ggml_add_backend skips the folders of disabled backends
mkdir -p "$SRC/ggml/src"
find "$FULL/ggml/src" -maxdepth 1 -type f -exec cp -a {} "$SRC/ggml/src/" \;
cp -a "$FULL/ggml/src/ggml-cpu" "$FULL/ggml/src/ggml-cuda" "$SRC/ggml/src/"
# the CPU backend on x86-64 only: other architectures' kernels, the Arm and RISC-V vendor libraries
find "$SRC/ggml/src/ggml-cpu/arch" -mindepth 1 -maxdepth 1 ! -name x86 -exec rm -rf {} +
rm -rf "$SRC/ggml/src/ggml-cpu/kleidiai" "$SRC/ggml/src/ggml-cpu/spacemit"
find "$SRC" \( -name '*.md' -o -name '.gitignore' \) -delete

# the tools and vendored libraries that are left
cat > "$SRC/tools/CMakeLists.txt" <<'EOF'
# trimmed by moeslots scripts/sidebyside/prepare.sh: only llama-bench and llama-completion
find_package(Threads REQUIRED)
llama_add_compile_flags()
add_subdirectory(llama-bench)
add_subdirectory(completion)
EOF
cat > "$SRC/vendor/CMakeLists.txt" <<'EOF'
# trimmed by moeslots scripts/sidebyside/prepare.sh: what llama-common needs
add_subdirectory(nlohmann)
add_subdirectory(sheredom)
if (LLAMA_BUILD_COMMON)
    add_subdirectory(cpp-httplib)
endif()
EOF
for f in "$FULL/vendor/nlohmann/CMakeLists.txt" "$FULL/vendor/sheredom/CMakeLists.txt"; do
    [[ -f $f ]] || die "unexpected upstream layout: no ${f#"$FULL"/}"
done

shopt -s nullglob
patches=("$HERE"/patches/*.patch)
for p in "${patches[@]}"; do
    patch -d "$SRC" -p1 --dry-run --quiet < "$p" >/dev/null || die "patch does not apply: $(basename "$p")"
done
for p in "${patches[@]}"; do
    echo "applying $(basename "$p")"
    patch -d "$SRC" -p1 --quiet --no-backup-if-mismatch < "$p"
done
(cd "$HERE/patches" && ls -1 -- *.patch 2>/dev/null; echo "sdist sha256 $SDIST_SHA256") > "$SRC/MOESLOTS-PATCHES"

TAR=$OUT/$NAME.tar.xz
# reproducible: sorted names, fixed owner and mtime
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=2026-10-11 -C "$WORK" -cf - "$NAME" \
    | xz -9e -T1 > "$TAR.tmp"
mv "$TAR.tmp" "$TAR"
(cd "$OUT" && sha256sum "$NAME.tar.xz" > "$NAME.tar.xz.sha256")
echo "wrote $TAR ($(du -k "$TAR" | cut -f1) KiB, $(find "$SRC" -type f | wc -l) files; sha256 in $NAME.tar.xz.sha256)"
