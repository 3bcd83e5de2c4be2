"""The Engine interface the app uses: streaming chat, cancel, KV reuse across turns, slots between turns,
snapshots consistent with the native stats, clear errors."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from moeslots.engine.errors import EngineError
from moeslots.engine.native.expert_cache import SlotPlan
from moeslots.engine.runtime.engine import Done, Engine, EngineConfig, Message, TextDelta


@pytest.fixture()
def engine(tiny_glm: Path):
    e = Engine(EngineConfig(model=tiny_glm, n_ctx=512, threads=2, pack_host=True, max_tokens=24))
    yield e
    e.close()


def _reply(e: Engine, msgs: list[Message], **kw) -> tuple[str, Done]:
    parts, done = [], None
    for ev in e.chat(msgs, **kw):
        if isinstance(ev, TextDelta):
            parts.append(ev.text)
        else:
            done = ev
    assert done is not None
    assert "".join(parts) == done.text
    return done.text, done


def test_chat_streams_and_is_deterministic(engine: Engine) -> None:
    msgs = [Message("user", "hello experts")]
    a, da = _reply(engine, msgs)
    engine.new_chat()
    b, db = _reply(engine, msgs)
    assert a == b and da.stats.tokens == db.stats.tokens > 0
    assert da.stats.prompt_tokens > 0


def test_second_turn_reuses_the_prefix_and_slots_change_between_turns(engine: Engine) -> None:
    msgs = [Message("user", "hello experts")]
    text, d1 = _reply(engine, msgs)
    f = engine.model.facts
    line = engine.set_slots(SlotPlan.uniform([il for il in f.moe_layers if il < f.n_layer], 8, f.n_expert))
    assert "8 slots" in line and engine.snapshot().load_line == line
    msgs2 = msgs + [Message("assistant", text), Message("user", "and then?")]
    _, d2 = _reply(engine, msgs2)
    assert d2.stats.prompt_tokens < len(engine._tokens) - d2.stats.tokens   # only the new part was prefilled
    snap = engine.snapshot()
    assert 0 < snap.gpu_share < 1 and snap.upload_mb_per_token == 0.0
    assert len(snap.layers) == 2 and all(len(ls.slot_experts) == 8 for ls in snap.layers)
    assert snap.pack_bytes > 0 and snap.tok_s_last > 0


def test_cancel_stops_and_the_next_turn_works(engine: Engine) -> None:
    stop = threading.Event()
    got = []
    for ev in engine.chat([Message("user", "count")], cancel=stop):
        got.append(ev)
        if isinstance(ev, TextDelta):
            stop.set()
    assert isinstance(got[-1], Done) and got[-1].stats.cancelled
    _, d = _reply(engine, [Message("user", "count")])
    assert not d.stats.cancelled


def test_slots_without_a_profile_say_how_to_record_one(tiny_glm: Path) -> None:
    with pytest.raises(EngineError, match="moeslots record"):
        Engine(EngineConfig(model=tiny_glm, slots=16, threads=2, pack_host=True))


def test_a_failed_reconfigure_keeps_the_previous_plan(engine: Engine) -> None:
    f = engine.model.facts
    good = SlotPlan.uniform([1, 2], 4, f.n_expert)
    engine.set_slots(good)
    with pytest.raises(EngineError, match="listed twice"):
        engine.set_slots(SlotPlan({1: (2, 2)}))
    assert "4 slots" in engine.load_line
    _reply(engine, [Message("user", "still here?")])


def test_slots_from_a_recorded_profile(tiny_glm: Path, tmp_path: Path) -> None:
    from moeslots.engine.runtime.record import record

    prompt = tmp_path / "p.txt"
    prompt.write_text("def route(x): return x")
    prof = tmp_path / "prof.csv"
    t = record(tiny_glm, [prompt], prof, n_decode=24, threads=2)
    assert t.decode_tokens == 24 and prof.exists()
    e = Engine(EngineConfig(model=tiny_glm, slots=4, profile=prof, threads=2, pack_host=True, max_tokens=8))
    try:
        assert "x 4 slots" in e.load_line
        snap = e.snapshot()
        assert all(len(ls.slot_experts) == 4 for ls in snap.layers)
        _reply(e, [Message("user", "hi")])
    finally:
        e.close()


def test_a_profile_of_another_model_is_refused(tiny_glm: Path, tmp_path: Path) -> None:
    p = tmp_path / "other.csv"
    p.write_text("# arch=qwen3moe n_layer=48 n_expert=128 k=8\n0,1,1,2,3,4,5,6,7,8\n")
    with pytest.raises(EngineError, match=r"another model \(qwen3moe, 48 layers x 128 experts.*this one is glm4moe"):
        Engine(EngineConfig(model=tiny_glm, slots=4, profile=p, threads=2, pack_host=True))


def test_mtp_chat_equals_plain_chat(tiny_glm: Path, tiny_qwen: Path) -> None:
    msgs = [Message("user", "hello experts")]
    texts = {}
    for mtp in (False, True):
        e = Engine(EngineConfig(model=tiny_glm, n_ctx=512, threads=2, pack_host=True, max_tokens=32, mtp=mtp,
                                mtp_draft=2))
        try:
            t1, _ = _reply(e, msgs)
            t2, _ = _reply(e, msgs + [Message("assistant", t1), Message("user", "more")])
            texts[mtp] = (t1, t2)
            snap = e.snapshot()
            assert (snap.mtp_drafted > 0) == mtp
        finally:
            e.close()
    assert texts[False] == texts[True]
    e = Engine(EngineConfig(model=tiny_qwen, threads=2, pack_host=True))
    try:
        assert e.mtp is None and any("no NextN (MTP) block" in n for n in e.notices)
    finally:
        e.close()


def test_recording_writes_the_turns_routing(engine: Engine, tmp_path: Path) -> None:
    from moeslots.profiles.trace import read_csv

    engine.start_recording()
    assert engine.snapshot().recording
    _, d = _reply(engine, [Message("user", "record me")])
    t = engine.stop_recording(tmp_path / "rec.csv")
    back = read_csv(tmp_path / "rec.csv")
    f = engine.model.facts
    trunk = [il for il in f.moe_layers if il < f.n_layer]
    assert back.n_rows == t.n_rows and back.meta["n_expert"] == str(f.n_expert)
    assert back.decode_tokens == d.stats.tokens                     # one decode row per token and layer
    assert int((~back.decode).sum()) == d.stats.prompt_tokens * len(trunk)
    assert sorted(set(back.layer.tolist())) == trunk
    assert not engine.snapshot().recording


def test_record_then_apply_the_new_profile(tiny_glm: Path, tmp_path: Path) -> None:
    from moeslots.engine.runtime.record import record

    prompt = tmp_path / "p.txt"
    prompt.write_text("hello")
    first = tmp_path / "first.csv"
    record(tiny_glm, [prompt], first, n_decode=16, threads=2, temperature=1.0)
    e = Engine(EngineConfig(model=tiny_glm, slots=4, profile=first, threads=2, pack_host=True, max_tokens=12))
    try:
        assert "one slot per layer" in e.slots_info() and "host memory" in e.slots_info()
        e.start_recording()
        _reply(e, [Message("user", "something new")])
        new = tmp_path / "new.csv"
        e.stop_recording(new)
        ov = e.profile_overlap(new)
        assert ov is not None and 0.0 <= ov <= 1.0
        e.use_profile(new)
        line = e.set_slots(4)
        assert "x 4 slots" in line and e.cfg.profile == new
    finally:
        e.close()


def test_close_waits_for_a_cancelled_reply(tiny_glm: Path) -> None:
    """The app quits by cancelling and closing while the worker thread may still be decoding (re-picks on)."""
    import time

    e = Engine(EngineConfig(model=tiny_glm, n_ctx=1024, threads=2, pack_host=True, max_tokens=400, mtp=False,
                            slots=SlotPlan.uniform([1, 2], 4, 16), repick_every=2, repick_margin=0.0))
    stop = threading.Event()
    seen = []

    def run() -> None:
        for ev in e.chat([Message("user", "go on and on")], cancel=stop):
            seen.append(ev)

    t = threading.Thread(target=run)
    t.start()
    deadline = time.monotonic() + 30
    while not seen and time.monotonic() < deadline:      # cancel mid-reply, on a fast machine too
        time.sleep(0.001)
    stop.set()
    e.close()                       # must not free the model under the worker
    t.join(timeout=10)
    assert not t.is_alive() and isinstance(seen[-1], Done) and seen[-1].stats.cancelled


def test_no_mmap_loads_into_host_memory_and_chats_the_same(tiny_glm: Path) -> None:
    """`chat --no-mmap` ([app] mmap = false): experts read into (pinned, on a GPU build) host memory — faster
    prompts — with the same text."""
    msgs = [Message("user", "hello experts")]
    texts = []
    for mmap in (True, False):
        e = Engine(EngineConfig(model=tiny_glm, n_ctx=512, threads=2, pack_host=True, max_tokens=24, mmap=mmap,
                                slots=0))
        try:
            assert e.model.opts.use_mmap is mmap
            texts.append(_reply(e, msgs)[0])
        finally:
            e.close()
    assert texts[0] == texts[1]
