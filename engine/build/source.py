"""The engine's source: llama-cpp-python 0.3.36's sdist from PyPI (sha256 checked), unpacked, patched (engine.patchset)
and optionally trimmed, as `moeslots engine build` compiles it or `--export-source` writes it for an offline machine."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Callable, Sequence

from ..errors import BuildError
from .patchset import apply_patches, patches_hash

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
SDIST_NAME = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"

# What the trimmed source drops: it still builds, since llama.cpp is a subproject whose
# tests/tools/examples default OFF; only tools/mtmd is needed (and only when LLAVA_BUILD is on).
TRIM_PATHS = [
    ".git", ".github", ".devops", "docker", "docs", "tests", "examples", "scripts",
    "vendor/llama.cpp/.git", "vendor/llama.cpp/.github", "vendor/llama.cpp/.devops",
    "vendor/llama.cpp/models", "vendor/llama.cpp/docs", "vendor/llama.cpp/media",
    "vendor/llama.cpp/benches", "vendor/llama.cpp/tests", "vendor/llama.cpp/examples",
    "vendor/llama.cpp/tools/ui", "vendor/llama.cpp/app", "vendor/llama.cpp/skills",
    "vendor/llama.cpp/pocs", "vendor/llama.cpp/conversion",
] + [f"vendor/llama.cpp/ggml/src/ggml-{b}" for b in (
    "opencl", "sycl", "vulkan", "hexagon", "metal", "et", "webgpu", "openvino", "cann", "virtgpu",
    "musa", "zdnn", "zendnn", "rpc", "kompute")]
# Top-level "examples" of llama-cpp-python are python examples (not needed); keep its llama_cpp package.
KEEP_ALWAYS = {"vendor/llama.cpp/tools/mtmd"}
EXPORT_STAMP = "MOESLOTS_SOURCE.json"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch_sdist(cache: Path, log: Callable[[str], None] = print) -> Path:
    """The verified sdist, from the cache or downloaded with pip."""
    dest = cache / "sdist" / SDIST_NAME
    if dest.exists() and sha256_file(dest) == SDIST_SHA256:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    log(f"downloading llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} sdist from PyPI")
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}",
               "--no-deps", "--no-binary", "llama-cpp-python", "--no-build-isolation", "-d", tmp]
        r = subprocess.run(cmd, capture_output=True, text=True)
        got = Path(tmp) / SDIST_NAME
        if r.returncode != 0 or not got.exists():
            tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-5:])
            raise BuildError(f"could not download the llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} sdist "
                             f"(no internet? use --from-source DIR):\n{tail}")
        digest = sha256_file(got)
        if digest != SDIST_SHA256:
            raise BuildError(f"sdist sha256 mismatch: got {digest}, expected {SDIST_SHA256}")
        os.replace(got, dest)
    return dest


def unpack_sdist(sdist: Path, dest_parent: Path) -> Path:
    with tarfile.open(sdist) as tf:
        tf.extractall(dest_parent, filter="data")
    return dest_parent / SDIST_NAME.removesuffix(".tar.gz")


def trim_tree(tree: Path) -> None:
    for rel in TRIM_PATHS:
        if rel in KEEP_ALWAYS:
            continue
        p = tree / rel
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        elif p.exists() or p.is_symlink():
            p.unlink()


def sync_tree(src: Path, dst: Path) -> int:
    """Make dst a copy of src, rewriting only files whose bytes differ (so their mtimes, and with them the
    incremental build, survive). Returns the number of files written or removed."""
    changed = 0
    seen: set[Path] = set()
    for f in src.rglob("*"):
        rel = f.relative_to(src)
        seen.add(rel)
        out = dst / rel
        if f.is_symlink():
            target = os.readlink(f)
            if not (out.is_symlink() and os.readlink(out) == target):
                if out.exists() or out.is_symlink():
                    shutil.rmtree(out) if out.is_dir() and not out.is_symlink() else out.unlink()
                out.parent.mkdir(parents=True, exist_ok=True)
                os.symlink(target, out)
                changed += 1
        elif f.is_dir():
            out.mkdir(parents=True, exist_ok=True)
        else:
            if out.is_file() and not out.is_symlink() and out.stat().st_size == f.stat().st_size \
                    and out.read_bytes() == f.read_bytes():
                continue
            if out.is_dir() and not out.is_symlink():
                shutil.rmtree(out)
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f, out)      # new mtime: ninja must see the change
            shutil.copymode(f, out)
            changed += 1
    for f in sorted(dst.rglob("*"), reverse=True):
        if f.relative_to(dst) not in seen:
            if f.is_dir() and not f.is_symlink():
                shutil.rmtree(f, ignore_errors=True)
            elif f.exists() or f.is_symlink():
                f.unlink()
            changed += 1
    return changed


def tree_size(tree: Path) -> int:
    return sum(f.stat().st_size for f in tree.rglob("*") if f.is_file() and not f.is_symlink())


def prepare_source(dest: Path, cache: Path, patches: Sequence[Path], *, trim: bool,
                   log: Callable[[str], None] = print) -> Path:
    """Unpack the verified sdist into dest (replaced) and apply the series; returns the source root."""
    sdist = fetch_sdist(cache, log)
    if dest.exists():
        shutil.rmtree(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        root = unpack_sdist(sdist, Path(tmp))
        apply_patches(root, patches)
        if trim:
            trim_tree(root)
        (root / EXPORT_STAMP).write_text(json.dumps({
            "llama_cpp_python": LLAMA_CPP_PYTHON_VERSION, "sdist_sha256": SDIST_SHA256,
            "patches": [p.name for p in patches], "patch_id": patches_hash(patches)}, indent=1))
        os.replace(root, dest)
    return dest
