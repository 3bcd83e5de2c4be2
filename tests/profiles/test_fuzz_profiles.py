"""Hypothesis: one field of a recorded profile CSV (a `# key=value` value, a header name, a row's cell) replaced by
another number or a short text never crashes anything that reads it: `profile show`, `simulate` (in process: exit 0,
or 2 with one line) and the engine planning its slots from it and chatting (a subprocess per example: it opens, or
refuses with one line). MOESLOTS_FUZZ=N runs N times the examples (CI: 1)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from probe_load import run as probe


@pytest.fixture(scope="module")
def recorded(tiny_glm: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    from moeslots.engine.runtime.record import record

    d = tmp_path_factory.mktemp("fuzzprof")
    (d / "p.txt").write_text("def route(x):\n    return x")
    record(tiny_glm, [d / "p.txt"], d / "prof.csv", n_decode=12, threads=2)
    return (d / "prof.csv").read_text()


def fields(text: str) -> list[tuple[int, int]]:
    """(line, field) of every value: `#` line values, header names, row cells."""
    out = []
    for i, line in enumerate(text.splitlines()):
        parts = line[1:].split() if line.startswith("#") else line.split(",")
        out += [(i, j) for j in range(len(parts))]
    return out


def replace(text: str, line: int, field: int, value: str) -> str:
    lines = text.splitlines()
    if lines[line].startswith("#"):
        toks = lines[line][1:].split()
        key = toks[field].partition("=")[0]
        toks[field] = f"{key}={value}"
        lines[line] = "# " + " ".join(toks)
    else:
        cells = lines[line].split(",")
        cells[field] = value
        lines[line] = ",".join(cells)
    return "\n".join(lines) + "\n"


NEW = st.one_of(st.sampled_from(["-1", "0", "1", "3", "4", "5", "15", "16", "17", "64", str(1 << 20), str(1 << 40),
                                 "", "x", "1.5", "glm4moe", "qwen3moe"]),
                st.integers(-(1 << 64), 1 << 64).map(str),
                st.text(alphabet="0123456789-x=, #", max_size=6))


@pytest.mark.slow
def test_one_corrupted_profile_field_never_crashes(recorded: str, tiny_glm: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from moeslots import cli

    where = fields(recorded)
    p = tmp_path / "fuzz.csv"

    @settings(max_examples=25 * int(os.environ.get("MOESLOTS_FUZZ", "1")), deadline=None, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(at=st.sampled_from(where), value=NEW)
    def one(at: tuple[int, int], value: str) -> None:
        p.write_text(replace(recorded, *at, value))
        for cmd in (["profile", "show", str(p)], ["simulate", str(p), "--slots", "4"]):
            rc = cli.main(cmd)
            err = capsys.readouterr().err
            assert rc in (0, 2), (cmd, rc, err)
            assert "Traceback" not in err and (rc == 0 or len(err.strip().splitlines()) == 1), err
        probe(tiny_glm, str(p), "4", timeout=60)

    one()
