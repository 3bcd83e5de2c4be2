"""Patch 0009's scheduler rules on the CPU (tests/engine/sched_waits.cpp): with a stand-in discrete device beside the
CPU backend, a split that begins with a node flagged GGML_TENSOR_FLAG_WAITS does not wait for the device's queue;
an unflagged one does, and so does a flagged one where the device can use the CPU's buffers. A node flagged
GGML_TENSOR_FLAG_HOST_SRCS on the device reads a source in the device's host buffer type in place; unflagged, or
with the source in the CPU's own buffer type or in compute memory, it reads the scheduler's copy. On the GPU the
rules run under the fetch-split tier (scripts/h200/policy-check.sh). The stand-in is written against
ggml-backend-impl.h, which the engine does not install: it comes from the sdist the engine was built from (the
series does not patch it)."""

from __future__ import annotations

import subprocess
import tarfile
from pathlib import Path

import pytest
from test_mmid_op import build_op_test

from moeslots.engine.build.source import SDIST_NAME, SDIST_SHA256, sha256_file
from moeslots.engine.build.wheel import cache_root

SOURCE = Path(__file__).with_name("sched_waits.cpp")
HEADER = f"{SDIST_NAME.removesuffix('.tar.gz')}/vendor/llama.cpp/ggml/src/ggml-backend-impl.h"


def test_a_waiting_node_starts_while_a_discrete_device_runs(tmp_path: Path) -> None:
    sdist = cache_root() / "sdist" / SDIST_NAME
    if not sdist.exists() or sha256_file(sdist) != SDIST_SHA256:
        pytest.skip(f"no verified {SDIST_NAME} in the engine's cache (the engine was installed from a wheel)")
    header = tmp_path / "impl" / Path(HEADER).name
    header.parent.mkdir()
    with tarfile.open(sdist) as tar:
        f = tar.extractfile(HEADER)
        assert f is not None
        header.write_bytes(f.read())
    exe = build_op_test(tmp_path, SOURCE, "sched_waits", includes=[header.parent])
    p = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "7 passed, 0 failed" in p.stdout, p.stdout[-3000:] + p.stderr[-2000:]
    # the three cases as the rule says: unflagged waits, flagged on a discrete device does not, integrated does
    assert "ok flagged, discrete: 2 splits" in p.stdout and "(synchronizes after its compute: 1, want 1)" in p.stdout
    # and a flagged node reads its host source in place, the others a copy
    assert "ok host source, flagged: FAKE's log: reads-in-place" in p.stdout
    assert "ok host source, unflagged" in p.stdout and "ok CPU source, flagged" in p.stdout
    assert "ok host compute source, flagged: FAKE's log: sync sync reads-a-copy" in p.stdout
