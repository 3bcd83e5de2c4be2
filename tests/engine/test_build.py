"""The build pipeline: cache keying, patch application errors, incremental source sync, fast no-op rebuild."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from moeslots.engine.build import patchset
from moeslots.engine.build import wheel as build


def _series(tmp: Path, contents: dict[str, str]) -> Path:
    d = tmp / "patches"
    d.mkdir(exist_ok=True)
    for name, text in contents.items():
        (d / name).write_text(text)
    return d


def test_key_changes_with_each_input(tmp_path: Path) -> None:
    d = _series(tmp_path, {"0001-a.patch": "A", "0002-b.patch": "B"})
    files = build.patch_files(d)
    assert [f.name for f in files] == ["0001-a.patch", "0002-b.patch"]
    pid = build.patches_hash(files)
    base = build.build_key("s1", pid, build.BuildFlags())
    assert base == build.build_key("s1", pid, build.BuildFlags())                    # deterministic
    assert base != build.build_key("s2", pid, build.BuildFlags())                    # sdist
    assert base != build.build_key("s1", pid, build.BuildFlags(cuda=True, cuda_arch="90"))  # flags
    assert base != build.build_key("s1", pid, build.BuildFlags(native=False))
    (d / "0002-b.patch").write_text("B changed")
    assert build.patches_hash(build.patch_files(d)) != pid                           # patch content
    (d / "0002-b.patch").rename(d / "0003-b.patch")
    assert build.patches_hash(build.patch_files(d)) != pid                           # patch name/order


def test_cuda_flags_carry_arch() -> None:
    args = build.BuildFlags(cuda=True, cuda_arch="90").cmake_args("abc")
    assert "-DGGML_CUDA=ON" in args and "-DCMAKE_CUDA_ARCHITECTURES=90-real" in args
    assert "-DMOESLOTS_PATCH_ID=abc" in args
    assert "-DGGML_CUDA=ON" not in build.BuildFlags().cmake_args("abc")


def _tree(tmp: Path) -> Path:
    t = tmp / "tree"
    (t / "src").mkdir(parents=True)
    (t / "src" / "a.c").write_text("int a(void) {\n    return 1;\n}\n")
    (t / "src" / "b.c").write_text("int b(void) {\n    return 2;\n}\n")
    return t


GOOD = """--- a/src/a.c
+++ b/src/a.c
@@ -1,3 +1,3 @@
 int a(void) {
-    return 1;
+    return 10;
 }
"""
BAD = """--- a/src/b.c
+++ b/src/b.c
@@ -1,3 +1,3 @@
 int b(void) {
-    return 99;
+    return 20;
 }
"""


def test_patches_apply_in_order(tmp_path: Path) -> None:
    t = _tree(tmp_path)
    d = _series(tmp_path, {"0001-good.patch": GOOD})
    patchset.apply_patches(t, build.patch_files(d))
    assert "return 10;" in (t / "src" / "a.c").read_text()


def test_failing_patch_is_named_with_its_hunk(tmp_path: Path) -> None:
    t = _tree(tmp_path)
    d = _series(tmp_path, {"0001-good.patch": GOOD, "0002-broken.patch": BAD})
    with pytest.raises(patchset.PatchError) as ei:
        patchset.apply_patches(t, build.patch_files(d))
    msg = str(ei.value)
    assert "0002-broken.patch" in msg and "hunk #1" in msg and "src/b.c" in msg
    assert "return 2;" in (t / "src" / "b.c").read_text()          # dry run first: nothing half-applied


def test_real_series_applies_to_the_sdist_tree_layout() -> None:
    files = build.patch_files()
    assert files, "engine/patches/ must hold the series"
    for f in files:
        text = f.read_text()
        assert "+++ b/vendor/llama.cpp/" in text, f"{f.name}: paths must be relative to the sdist root (-p1)"


def test_sync_tree_rewrites_only_changed_files(tmp_path: Path) -> None:
    src, dst = tmp_path / "s", tmp_path / "d"
    (src / "x").mkdir(parents=True)
    (src / "x" / "same.txt").write_text("same")
    (src / "x" / "chg.txt").write_text("old")
    assert build.sync_tree(src, dst) == 2
    old = time.time() - 1000
    os.utime(dst / "x" / "same.txt", (old, old))
    (src / "x" / "chg.txt").write_text("new")
    (dst / "stale.txt").write_text("gone")
    assert build.sync_tree(src, dst) == 2               # one rewrite + one removal
    assert (dst / "x" / "same.txt").stat().st_mtime == pytest.approx(old)
    assert (dst / "x" / "chg.txt").read_text() == "new"
    assert not (dst / "stale.txt").exists()


def test_cached_wheel_skips_the_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    d = _series(tmp_path, {"0001-a.patch": GOOD})
    flags = build.BuildFlags(native=False)
    key = build.build_key(build.SDIST_SHA256, build.patches_hash(build.patch_files(d)), flags)
    wheel = cache / "wheels" / key / "llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl"
    wheel.parent.mkdir(parents=True)
    wheel.write_bytes(b"fake")
    installed: list[Path] = []
    monkeypatch.setattr(build, "install_wheel", lambda w, k: installed.append(w))
    monkeypatch.setattr(build, "installed_key", lambda: None)

    def no_build(*a: object, **k: object) -> Path:
        raise AssertionError("must not build when the wheel is cached")

    monkeypatch.setattr(build, "build_wheel", no_build)
    res = build.ensure_engine(flags, cache=cache, patches_dir=d, log=lambda m: None)
    assert res.action == "installed-cached" and installed == [wheel]
    # a changed series is a miss: it must reach the build step
    (d / "0001-a.patch").write_text(GOOD + "\n")
    monkeypatch.setattr(build, "prepare_source", lambda dest, *a, **k: dest)
    monkeypatch.setattr(build, "sync_tree", lambda s, t: 0)
    with pytest.raises(AssertionError, match="must not build"):
        build.ensure_engine(flags, cache=cache, patches_dir=d, log=lambda m: None)


def test_from_source_rejects_other_patch_series(tmp_path: Path) -> None:
    src = tmp_path / "exported"
    src.mkdir()
    (src / build.EXPORT_STAMP).write_text('{"patch_id": "0000"}')
    with pytest.raises(build.BuildError, match="export it again"):
        build.ensure_engine(build.BuildFlags(), from_source=src, cache=tmp_path / "c", log=lambda m: None)
    with pytest.raises(build.BuildError, match="not a tree written by"):
        build.ensure_engine(build.BuildFlags(), from_source=tmp_path, cache=tmp_path / "c", log=lambda m: None)


def test_rebuild_with_nothing_changed_takes_seconds() -> None:
    """`make test` has just built/installed the engine: a second build must be a key comparison."""
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "moeslots", "engine", "build"], capture_output=True, text=True,
                       timeout=120)
    dt = time.perf_counter() - t0
    assert r.returncode == 0, r.stderr
    assert "engine up to date" in r.stderr
    assert dt < 15, f"no-op rebuild took {dt:.1f} s"


def test_the_up_to_date_check_reads_the_installed_engine() -> None:
    """`engine build` trusts its install marker only when the installed library carries this checkout's patch id
    (a pip install over the engine leaves the marker behind)."""
    from moeslots.engine.build import wheel as build
    from moeslots.engine.native import lib as native

    assert build._installed_patch_id() == native.expected_patch_id()


def test_the_series_applies_in_order_to_the_pinned_sdist(tmp_path: Path) -> None:
    """Every patch of engine/patches applies, in file-name order and each on the ones before it, to the files it
    touches in llama-cpp-python's sdist (sha256 checked; the cached one, or downloaded as the engine build does)."""
    import tarfile

    from moeslots.engine.build import source

    files = build.patch_files()
    touched = {line[6:].split("\t")[0] for f in files for line in f.read_text().splitlines()
               if line.startswith(("--- a/", "+++ b/"))}
    root = source.SDIST_NAME.removesuffix(".tar.gz")
    with tarfile.open(source.fetch_sdist(build.cache_root(), log=lambda _: None)) as tf:
        members = [m for m in tf.getmembers() if m.name.removeprefix(root + "/") in touched]
        assert members, "the sdist holds none of the files the series patches"
        tf.extractall(tmp_path, members=members, filter="data")
    tree = tmp_path / root
    for i, f in enumerate(files):
        patchset.apply_patches(tree, [f])                  # raises PatchError naming the patch and its hunk
        assert f.name.startswith(f"{i + 1:04d}-"), f"{f.name}: the series is numbered 0001, 0002, ... in order"
    assert (tree / "vendor/llama.cpp/include/llama-moeslots.h").exists()
