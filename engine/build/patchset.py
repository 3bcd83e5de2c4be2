"""The patch series (engine/patches/*.patch, in apply order): its files, its id (a hash of names and contents; the
engine carries the id it was built from, engine.native compares) and applying it to a source tree."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
from pathlib import Path
from typing import Iterable, Sequence

from ..errors import BuildError, PatchError

PATCHES_DIR = Path(__file__).resolve().parents[1] / "patches"


def patch_files(patches_dir: Path = PATCHES_DIR) -> list[Path]:
    return sorted(patches_dir.glob("*.patch"))


def patches_hash(files: Sequence[Path]) -> str:
    """Hash of the series: names and contents, in apply order."""
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0")
        h.update(f.read_bytes())
        h.update(b"\0")
    return h.hexdigest()[:16]


_HUNK_FAIL = re.compile(r"Hunk #(\d+) FAILED at (\d+)")
_CHECKING = re.compile(r"^(?:checking|patching) file (.+)$")


def apply_patches(tree: Path, patches: Iterable[Path]) -> None:
    """Apply each patch (-p1) in order; dry-run first, so a failing patch leaves no half-applied files."""
    tool = shutil.which("patch")
    if tool is None:
        raise BuildError("the `patch` program is missing (apt install patch)")
    for p in patches:
        base = [tool, "-p1", "--forward", "--batch", "--no-backup-if-mismatch", "-d", str(tree), "-i", str(p)]
        dry = subprocess.run(base + ["--dry-run"], capture_output=True, text=True)
        if dry.returncode != 0:
            raise PatchError(f"patch {p.name} does not apply: {_explain_patch_failure(dry.stdout + dry.stderr)}")
        real = subprocess.run(base, capture_output=True, text=True)
        if real.returncode != 0:
            raise PatchError(f"patch {p.name} failed: {_explain_patch_failure(real.stdout + real.stderr)}")


def _explain_patch_failure(out: str) -> str:
    current = "?"
    problems = []
    for line in out.splitlines():
        m = _CHECKING.match(line.strip())
        if m:
            current = m.group(1)
            continue
        h = _HUNK_FAIL.search(line)
        if h:
            problems.append(f"hunk #{h.group(1)} of {current} (at line {h.group(2)})")
        elif "can't find file" in line or "No such file" in line:
            problems.append(f"missing file ({line.strip()})")
        elif "Reversed (or previously applied)" in line:
            problems.append(f"{current} already patched")
        elif "malformed patch" in line or "Only garbage" in line:
            problems.append(line.strip())
    if problems:
        return "; ".join(dict.fromkeys(problems))
    lines = out.strip().splitlines()
    return lines[-1] if lines else "unknown error"
