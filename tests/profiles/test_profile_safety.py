"""A profile is never lost or silently misapplied: the shape check works in both directions, a profile
without decode rows is said, an interrupt before the first decode token or an empty Ctrl+R keeps the old file, and
written files follow the umask."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Iterator

import pytest

from moeslots.engine.errors import EngineError
from moeslots.engine.runtime.engine import Engine, EngineConfig, Message
from moeslots.profiles.trace import from_rows, write_csv

GOOD = "# arch=glm4moe n_layer=4 n_expert=16 k=4 model=good tokens=1\npos,layer,id0,id1,id2,id3\n0,1,1,2,3,4\n"


def _engine(model: Path, profile: Path, slots: int = 4) -> Engine:
    return Engine(EngineConfig(model=model, slots=slots, profile=profile, threads=2, pack_host=True, max_tokens=4))


@pytest.mark.parametrize("meta,why", [
    ("arch=glm4moe n_layer=3 n_expert=16 k=4", "n_layer: 3 in the profile, 4 in the model"),      # fewer layers
    ("arch=glm4moe n_layer=4 n_expert=8 k=4", "n_expert: 8 in the profile, 16 in the model"),     # fewer experts
    ("arch=glm4moe n_layer=6 n_expert=16 k=4", "n_layer: 6 in the profile, 4 in the model"),      # more layers
    ("arch=glm4moe n_layer=4 n_expert=64 k=4", "n_expert: 64 in the profile, 16 in the model"),   # more experts
])
def test_a_profile_of_another_shape_is_refused_both_ways(tiny_glm: Path, tmp_path: Path, meta: str, why: str) -> None:
    """A profile recorded on a model with fewer layers or experts was applied without a word (the check compared
    one way)."""
    p = tmp_path / "other.csv"
    p.write_text(f"# {meta}\n0,1,1,2,3,4\n0,2,0,1,2,3\n")
    with pytest.raises(EngineError) as e:
        _engine(tiny_glm, p)
    msg = str(e.value)
    assert "was recorded on another model" in msg and "this one is glm4moe, 4 layers x 16 experts, k=4" in msg
    assert why in msg and "\n" not in msg


def test_a_fork_profile_without_facts_must_fit(tiny_glm: Path, tmp_path: Path) -> None:
    fits, too_big = tmp_path / "fits.csv", tmp_path / "big.csv"
    fits.write_text("0,1,1,2,3,4\n0,2,5,6,7,8\n")
    too_big.write_text("0,1,1,2,3,4\n0,2,5,6,7,20\n")
    e = _engine(tiny_glm, fits)
    e.close()
    with pytest.raises(EngineError, match="it routes expert 20; the model has 16"):
        _engine(tiny_glm, too_big)


def test_a_profile_without_decode_rows_is_said(tiny_glm: Path, tmp_path: Path) -> None:
    """Prompt rows only (a recording stopped before the first token) planned an even spread without a notice."""
    p = tmp_path / "prompt-only.csv"
    p.write_text("# arch=glm4moe n_layer=4 n_expert=16 k=4\n-1,1,1,2,3,4\n-2,2,0,1,2,3\n")
    e = _engine(tiny_glm, p)
    try:
        said = [n for n in e.notices if "has no decode rows" in n]
        assert len(said) == 1 and "only prompt rows" in said[0] and "spread evenly" in said[0]
        e.set_slots(2)                                     # said once, not at every slot change
        assert len([n for n in e.notices if "has no decode rows" in n]) == 1
    finally:
        e.close()
    good = tmp_path / "good.csv"
    good.write_text(GOOD)
    e = _engine(tiny_glm, good)
    try:
        assert not [n for n in e.notices if "decode rows" in n]
    finally:
        e.close()


def test_an_interrupt_before_the_first_decode_token_keeps_the_old_profile(tiny_glm: Path, tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The prompt is read (its rows recorded), then Ctrl-C before a token: the old code replaced a good profile with
    that prompt-only trace."""
    from moeslots.engine.llm import model as model_mod
    from moeslots.engine.runtime.record import RecordInterrupted, record

    out = tmp_path / "prof.csv"
    out.write_text(GOOD)
    prompt = tmp_path / "p.txt"
    prompt.write_text("def f(x): return x")
    decode = model_mod.Context.decode

    def interrupted_at_first_token(self, tokens, *, all_logits=False, prompt=False):
        if not prompt:
            raise KeyboardInterrupt
        return decode(self, tokens, all_logits=all_logits, prompt=prompt)

    monkeypatch.setattr(model_mod.Context, "decode", interrupted_at_first_token)
    with pytest.raises(RecordInterrupted) as e:
        record(tiny_glm, [prompt], out, n_decode=8, threads=2)
    assert not e.value.saved and e.value.trace.n_rows > 0 and e.value.trace.decode_tokens == 0
    assert out.read_text() == GOOD
    monkeypatch.undo()
    with pytest.raises(EngineError, match="nothing recorded: no reply got a decode token; .* left as it was"):
        record(tiny_glm, [prompt], out, n_decode=0, threads=2)
    assert out.read_text() == GOOD


def test_ctrl_r_with_nothing_recorded_keeps_the_file_and_goes_on(tiny_glm: Path, tmp_path: Path) -> None:
    out = tmp_path / "prof.csv"
    out.write_text(GOOD)
    e = Engine(EngineConfig(model=tiny_glm, threads=2, pack_host=True, max_tokens=4))
    try:
        e.start_recording()
        with pytest.raises(EngineError, match="nothing recorded yet .* not written; still recording"):
            e.stop_recording(out)
        assert out.read_text() == GOOD and e.recording
        list(e.chat([Message("user", "hello")]))
        t = e.stop_recording(out)
        assert t.decode_tokens > 0 and out.read_text() != GOOD and not e.recording
    finally:
        e.close()


@pytest.fixture()
def umask() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def test_written_files_follow_the_umask(tmp_path: Path, umask: None) -> None:
    """mkstemp's 0600 went with every profile and config written (whatever the umask)."""
    from moeslots import configfile

    t = from_rows([(0, 1, [1, 2])], {"n_expert": "4"})
    write_csv(t, tmp_path / "a.csv")
    configfile.write_atomic({"app": {"mtp": True}}, tmp_path / "config.toml")
    os.umask(0o027)
    write_csv(t, tmp_path / "b.csv")
    assert stat.S_IMODE((tmp_path / "a.csv").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "config.toml").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "b.csv").stat().st_mode) == 0o640
    (tmp_path / "a.csv").chmod(0o600)                      # a file the user restricted keeps its mode
    write_csv(t, tmp_path / "a.csv")
    assert stat.S_IMODE((tmp_path / "a.csv").stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.csv", "b.csv", "config.toml"]   # no temp files left


def test_a_folder_or_a_failed_write_is_one_trace_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from moeslots.profiles.trace import TraceError

    t = from_rows([(0, 1, [1, 2])])
    with pytest.raises(TraceError, match=r"cannot write .*: is a folder, not a file name"):
        write_csv(t, tmp_path)
    write_csv(t, tmp_path / "keep.csv")
    before = (tmp_path / "keep.csv").read_bytes()
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(28, "No space left on device")))
    with pytest.raises(TraceError, match="No space left on device \\(the old file is kept\\)"):
        write_csv(from_rows([(0, 1, [3, 4])] * 100), tmp_path / "keep.csv")
    assert (tmp_path / "keep.csv").read_bytes() == before and len(list(tmp_path.iterdir())) == 1
