"""The ggml op test of MUL_MAT_ID with negative expert ids (tests/engine/mmid_op.cpp), built against the installed
engine's ggml and run on the CPU backend: every weight type the project writes or users load, batches 1..512, rows
with valid, mixed and only negative ids. A negative id must give an exact zero row; the other rows match a reference
and are bit-identical to a stock run. The same program runs over CUDA on the H200 (scripts/h200/mmid-op.sh)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Sequence

import pytest

SOURCE = Path(__file__).with_name("mmid_op.cpp")


def build_op_test(out: Path, source: Path = SOURCE, name: str = "mmid_op", includes: Sequence[Path] = ()) -> Path:
    """A C++ test program built against the installed engine's ggml (includes: more header folders)."""
    import llama_cpp

    pkg = Path(llama_cpp.__file__).resolve().parent
    inc, lib = pkg.parent / "include", pkg / "lib"
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    exe = out / name
    subprocess.run([cxx, "-O2", "-std=c++17", str(source), f"-I{inc}", *(f"-I{d}" for d in includes), f"-L{lib}",
                    "-lggml", "-lggml-base", "-lggml-cpu", f"-Wl,-rpath,{lib}", "-o", str(exe)], check=True)
    return exe


def run_op_test_on_cpu(out: Path, source: Path, name: str) -> str:
    """An op test program (its own reference, one line a case and a summary) built and run on the CPU backend: its
    output, once it exited 0."""
    exe = build_op_test(out, source, name)
    p = subprocess.run([str(exe), "--backend", "CPU"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    return p.stdout


@pytest.fixture(scope="module")
def op_test(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_op_test(tmp_path_factory.mktemp("mmid"))


def _run(exe: Path, *args: str) -> tuple[str, int, int]:
    p = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=600)
    m = re.search(r"^(\d+) passed, (\d+) failed, (\d+) skipped$", p.stdout, re.M)
    assert m, p.stdout[-2000:] + p.stderr[-2000:]
    failures = [ln for ln in p.stdout.splitlines() if ln.startswith("FAIL")]
    assert p.returncode == 0 and not failures, "\n".join(failures[:20]) + p.stderr[-2000:]
    return p.stdout, int(m.group(1)), int(m.group(3))


def test_negative_ids_on_the_cpu_for_every_type_and_batch(op_test: Path) -> None:
    out, passed, skipped = _run(op_test, "--threads", "2")
    assert skipped == 0
    # 8 types x 17 batch sizes x (ne11 = 1: 3 patterns x plain/fused + ne11 = k: 3 patterns)
    assert passed == 8 * 17 * 9
    for t in ("f32", "f16", "bf16", "q8_0", "q4_K", "q5_K", "q6_K", "mxfp4"):
        assert f"ok   {t:<5} T=512 ne11=1 none  fused" in out
        assert f"ok   {t:<5} T=1   ne11=4 mixed plain" in out


def test_negative_ids_in_the_cpu_repack_kernel(op_test: Path) -> None:
    out, passed, _ = _run(op_test, "--repack", "--threads", "2")
    if "nothing to check" in out or "no CPU_REPACK" in out:
        pytest.skip(out.splitlines()[0])
    assert "weights in CPU_REPACK" in out and passed == 17 * 9


@pytest.mark.parametrize("used, experts", [(1, 4), (3, 8), (12, 24)])
def test_negative_ids_with_other_expert_counts(op_test: Path, used: int, experts: int) -> None:
    # k other than 4 and 8: the generic id-sorting paths (CUDA's mm_ids_helper for any k; the CPU's row mapping)
    types = "f32,q8_0,q4_K,mxfp4"
    out, passed, skipped = _run(op_test, "--used", str(used), "--experts", str(experts), "--types", types,
                                "--batches", "1,2,5,33,512", "--threads", "2")
    assert skipped == 0
    per_batch = 9 if used > 1 else 6   # ne11 = k is ne11 = 1 when k = 1
    assert passed == 4 * 5 * per_batch
    assert f"ok   q4_K  T=512 ne11={1 if used == 1 else used} mixed plain" in out


@pytest.mark.parametrize("used, experts", [(4, 3), (8, 1), (8, 5)])
def test_negative_ids_in_a_pack_smaller_than_k(op_test: Path, used: int, experts: int) -> None:
    # a layer with S < k slots: each token's valid ids are distinct slots of the pack, the rest negative
    out, passed, skipped = _run(op_test, "--pack", "--used", str(used), "--experts", str(experts),
                                "--types", "f16,q4_K,q6_K", "--batches", "1,3,9,64", "--threads", "2")
    assert skipped == 0 and passed == 3 * 4 * 3
    assert "pack" in out and "FAIL" not in out
