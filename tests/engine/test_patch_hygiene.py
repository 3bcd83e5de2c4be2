"""What the patch series may not add (engine/patches/README.md, "for a reviewer upstream"): no GGML_ABORT and no
getenv in any added line (a failure returns an error the caller reports; behaviour is set through the C API, never
through the environment); no pointer turned into an integer (a node's op_params hold numbers: host memory an op
reads is a source tensor, so the graph, RPC and serialisation see it), save for an alignment test; and a patch
that adds ops bumps the RPC protocol's patch version in the same patch, as the static_assert in ggml-rpc.h asks."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

PATCHES = sorted((Path(__file__).resolve().parents[2] / "engine" / "patches").glob("*.patch"))


def _added(patch: Path) -> list[str]:
    return [ln[1:] for ln in patch.read_text().splitlines() if ln.startswith("+") and not ln.startswith("+++")]


def test_the_series_is_there() -> None:
    assert len(PATCHES) >= 9


@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: p.name[:4])
def test_no_abort_and_no_environment_knob(patch: Path) -> None:
    bad = [ln.strip() for ln in _added(patch) if re.search(r"\bGGML_ABORT\b|\bgetenv\s*\(", ln)]
    assert not bad, f"{patch.name} adds: {bad}"


@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: p.name[:4])
def test_no_pointer_as_a_number(patch: Path) -> None:
    casts = [ln.strip() for ln in _added(patch) if re.search(r"\(\s*u?intptr_t\s*\)", ln)]
    bad = [ln for ln in casts if not re.search(r"(&|%)\s*(15|16|7|8|3|4)\b", ln)]
    assert not bad, f"{patch.name} turns a pointer into a number: {bad}"


@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: p.name[:4])
def test_new_ops_bump_the_rpc_protocol(patch: Path) -> None:
    added = _added(patch)
    ops = [ln for ln in added if re.search(r"static_assert\(GGML_OP_COUNT == \d+, \"GGML_OP_COUNT has changed", ln)]
    bump = [ln for ln in added if re.match(r"#define RPC_PROTO_PATCH_VERSION\s+\d+", ln)]
    assert bool(ops) == bool(bump), f"{patch.name}: GGML_OP_COUNT changed {bool(ops)}, RPC version bumped {bool(bump)}"


def test_the_checks_catch_what_they_look_for(tmp_path: Path) -> None:
    p = tmp_path / "x.patch"
    p.write_text("+++ b/f.c\n+    if (x) { GGML_ABORT(\"no\"); }\n+    const char * v = getenv (\"K\");\n")
    with pytest.raises(AssertionError, match="GGML_ABORT"):
        test_no_abort_and_no_environment_knob(p)
    p.write_text("+++ b/ggml.c\n+    const uint64_t sp = (uint64_t) (uintptr_t) stage;\n"
                 "+    if (((uintptr_t) x & 15) == 0) {\n")
    with pytest.raises(AssertionError, match=r"sp = \(uint64_t\)"):
        test_no_pointer_as_a_number(p)
    p.write_text('+++ b/ggml-rpc.h\n+static_assert(GGML_OP_COUNT == 104, "GGML_OP_COUNT has changed - update")\n')
    with pytest.raises(AssertionError, match="RPC version bumped False"):
        test_new_ops_bump_the_rpc_protocol(p)
