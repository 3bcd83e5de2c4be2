"""Trace files in every form the reader accepts: CSV, CSV compressed (.gz, .xz), binary (.npz); the same
rows and facts from each, one-line TraceErrors for damaged files, and the one-call CSV parser agreeing with the
line-by-line one."""

from __future__ import annotations

import gzip
import io
import json
import lzma
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moeslots.profiles import trace as trace_mod
from moeslots.profiles.trace import Trace, TraceError, from_rows, read_csv, write_csv

META = {"arch": "glm4moe", "n_layer": "3", "n_expert": "200", "k": "2", "workload": "code"}


def _sample() -> Trace:
    return from_rows([(-2, 0, [3, 4]), (-2, 1, [5, 199]), (0, 0, [1, 2]), (0, 1, [7, 6]), (1, 0, [1, 9]),
                      (1, 1, [0, 150])], META)


@pytest.mark.parametrize("name", ["t.csv", "t.csv.gz", "t.csv.xz", "t.npz"])
def test_every_form_round_trips(tmp_path: Path, name: str) -> None:
    t = _sample()
    p = tmp_path / name
    write_csv(t, p)
    back = read_csv(p)
    assert np.array_equal(back.pos, t.pos) and np.array_equal(back.layer, t.layer)
    assert np.array_equal(back.ids, t.ids) and dict(back.meta) == META
    assert back.ids.dtype == np.int32 and back.pos.dtype == np.int64


def test_compressed_forms_are_compressed_and_stable(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    rows = [(t, il, list(rng.choice(128, 8, replace=False))) for t in range(300) for il in range(4)]
    t = from_rows(rows, {"n_expert": "128", "k": "8"})
    sizes = {}
    for name in ("a.csv", "a.csv.gz", "a.csv.xz", "a.npz"):
        write_csv(t, tmp_path / name)
        sizes[name] = (tmp_path / name).stat().st_size
    assert sizes["a.csv.gz"] < sizes["a.csv"] / 2 and sizes["a.csv.xz"] < sizes["a.csv"] / 2
    assert sizes["a.npz"] < sizes["a.csv.xz"]            # uint8 ids beat text
    with np.load(tmp_path / "a.npz") as z:
        assert z["ids"].dtype == np.uint8
    for name in ("a.csv.gz", "a.npz"):
        first = (tmp_path / name).read_bytes()
        write_csv(t, tmp_path / name)
        assert (tmp_path / name).read_bytes() == first           # no timestamp inside: same trace, same bytes
    # routing with locality (sorted ids drawn from 16 experts that drift): LZMA members beat numpy's own deflate
    hot = rng.choice(128, 16, replace=False)
    rows = []
    for tok in range(400):
        if tok % 25 == 0:
            hot[rng.integers(16)] = rng.integers(128)
        rows += [(tok, il, sorted(set(rng.choice(hot, 8, replace=False)))) for il in range(4)]
    rows = [r for r in rows if len(r[2]) == 8]
    loc = from_rows(rows, {"n_expert": "128", "k": "8"})
    write_csv(loc, tmp_path / "loc.npz")
    buf = io.BytesIO()
    np.savez_compressed(buf, pos=loc.pos, layer=loc.layer.astype(np.uint16), ids=loc.ids.astype(np.uint8),
                        meta=np.array(json.dumps(dict(loc.meta), sort_keys=True)))
    assert (tmp_path / "loc.npz").stat().st_size < len(buf.getvalue())


def test_a_bad_row_in_a_compressed_csv_is_named(tmp_path: Path) -> None:
    p = tmp_path / "bad.csv.gz"
    p.write_bytes(gzip.compress(b"# k=2\n0,0,1,2\n0,1,1,x\n"))
    with pytest.raises(TraceError, match=r"bad.csv.gz:3: not a trace row"):
        read_csv(p)
    q = tmp_path / "bad.csv.xz"
    q.write_bytes(lzma.compress(b"0,0,1,2\n1,0,1\n"))
    with pytest.raises(TraceError, match=r"bad.csv.xz:2: 1 expert ids, earlier rows have 2"):
        read_csv(q)


@pytest.mark.parametrize("name,data,needle", [
    ("c.csv.gz", b"not gzip at all", "cannot read trace"),
    ("c.csv.gz", gzip.compress(b"0,0,1,2\n" * 50)[:-12], "cannot read trace"),       # truncated
    ("c.csv.xz", b"\xfd7zXZ\x00garbage", "cannot read trace"),
    ("c.npz", b"PK\x03\x04 not a zip", "cannot read trace"),
    ("c.csv.gz", gzip.compress("\u00ff".encode("latin-1")), "cannot read trace"),     # not UTF-8
])
def test_damaged_files_give_one_line(tmp_path: Path, name: str, data: bytes, needle: str) -> None:
    p = tmp_path / name
    p.write_bytes(data)
    with pytest.raises(TraceError, match=needle) as e:
        read_csv(p)
    assert "\n" not in str(e.value)


def _npz(path: Path, **arrays: np.ndarray) -> None:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    path.write_bytes(buf.getvalue())


def test_npz_contents_are_checked(tmp_path: Path) -> None:
    meta = np.array(json.dumps({"n_expert": "8"}))
    ok = {"pos": np.array([0, 1]), "layer": np.array([0, 0], np.uint16), "ids": np.array([[1, 2], [3, 4]], np.uint8)}
    cases = [({**ok}, "no 'meta' array"),
             ({**ok, "meta": np.array("[1, 2]")}, "not a JSON object"),
             ({**ok, "meta": meta, "ids": np.array([1, 2], np.uint8)}, "do not form rows"),
             ({**ok, "meta": meta, "layer": np.array([0.5, 1.0])}, "do not form rows"),
             ({**ok, "meta": meta, "ids": np.array([[1, 2], [3, 9]], np.uint8)}, r"expert id 9 >= n_expert=8"),
             ({**ok, "meta": meta, "pos": np.array([0, 1 << 41])}, "out of range")]
    for i, (arrays, needle) in enumerate(cases):
        p = tmp_path / f"{i}.npz"
        _npz(p, **arrays)
        with pytest.raises(TraceError, match=needle):
            read_csv(p)
    with pytest.raises(TraceError, match="trace not found"):
        read_csv(tmp_path / "missing.npz")


def test_the_fast_parser_is_used_and_agrees(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = tmp_path / "a.csv"
    write_csv(_sample(), p)
    assert trace_mod._fast_rows(p.read_text()) is not None
    fast = read_csv(p)
    monkeypatch.setattr(trace_mod, "_fast_rows", lambda text: None)
    slow = read_csv(p)
    assert np.array_equal(fast.ids, slow.ids) and np.array_equal(fast.pos, slow.pos) and fast.meta == slow.meta


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(alphabet="0123456789,- \n#k=", max_size=30), max_size=8))
def test_fast_and_slow_parsers_agree_on_any_text(tmp_path_factory: pytest.TempPathFactory,
                                                 lines: list[str]) -> None:
    text = "\n".join(lines)
    fast = trace_mod._fast_rows(text)
    if fast is None:
        return                              # the line-by-line parser decides (and is fuzzed in test_profiles.py)
    meta, rows = fast
    p = tmp_path_factory.mktemp("fastslow") / "t.csv"
    p.write_text(text)
    orig = trace_mod._fast_rows
    trace_mod._fast_rows = lambda t: None
    try:
        slow = read_csv(p)
    except TraceError:
        return                               # facts that contradict the rows: both paths raise in _checked
    finally:
        trace_mod._fast_rows = orig
    assert np.array_equal(slow.ids, rows[:, 2:]) and np.array_equal(slow.pos, rows[:, 0]) and dict(slow.meta) == meta
