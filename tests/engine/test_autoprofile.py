"""The automatic profile (engine.autoprofile) on the bundled model, packs in host memory (CI has no GPU): the first
session plans its slots from the first prompt and saves a profile, the next one starts with it; a short session
never replaces it; --profile wins."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

from moeslots.engine.machine import bundled
from moeslots.engine.runtime import autoprofile
from moeslots.engine.runtime.engine import Done, Engine, EngineConfig, Message
from moeslots.engine.runtime.slot_plans import plan_from_profile
from moeslots.profiles.plan import plan_from_counts
from moeslots.profiles.trace import read_csv

PROMPT = [Message("user", "def parse_args(argv):")]


def _engine(model: Path, **kw: object) -> Engine:
    args: dict = dict(model=model, n_ctx=1024, threads=2, pack_host=True, mtp=False, slots=16, auto_profile=True,
                      max_tokens=80)
    args.update(kw)
    return Engine(EngineConfig(**args))


def _reply(e: Engine, msgs: list[Message] = PROMPT, max_tokens: int | None = None) -> Done:
    done = [ev for ev in e.chat(msgs, max_tokens=max_tokens) if isinstance(ev, Done)]
    return done[-1]


@pytest.fixture(scope="module")
def data_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    d = tmp_path_factory.mktemp("xdg-data")
    old = os.environ.get("XDG_DATA_HOME")
    os.environ["XDG_DATA_HOME"] = str(d)
    yield d
    if old is None:
        os.environ.pop("XDG_DATA_HOME", None)
    else:
        os.environ["XDG_DATA_HOME"] = old


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the bundled model (its key is its own; the user's data dir is never touched)."""
    p = tmp_path_factory.mktemp("m") / "moeslots-tiny-glm4moe.gguf"
    shutil.copyfile(bundled.model(), p)
    return p


@pytest.fixture(scope="module")
def first_session(model: Path, data_home: Path) -> dict:
    """No profile: the first prompt plans 16 slots per layer before decoding; a reply of >= 64 tokens is saved."""
    saved = autoprofile.saved_path(model)
    assert not saved.exists()
    e = _engine(model)
    try:
        out: dict = {"notices_at_load": list(e.notices), "plan_at_load": e.state.plan, "saved": saved}
        done = _reply(e)
        out["done"] = done
        out["plan"] = e.state.plan
        ring = e.ctx.read_stats().ring
        f = e.model.facts
        prompt = ring[ring[:, 0] < 0]
        keys = (prompt[:, 1:2].astype(np.int64) * f.n_expert + prompt[:, 2:]).ravel()
        counts = np.bincount(keys, minlength=e.model.n_layer_all * f.n_expert).reshape(-1, f.n_expert)
        out["prompt_plan"] = plan_from_counts(counts, 16, [il for il in f.moe_layers if il < f.n_layer])
    finally:
        e.close()                                      # waits for the background save
    out["notices"] = list(e.notices)
    return out


def test_first_session_plans_from_the_first_prompt(first_session: dict) -> None:
    s = first_session
    assert not s["plan_at_load"].layers                                  # nothing to plan from at load
    assert any(n.startswith("no profile for ") and "slots planned from your first prompt" in n
               and "profiles/auto/" in n for n in s["notices_at_load"])
    assert s["plan"].slots_per_layer == 16
    assert dict(s["plan"].layers) == s["prompt_plan"]                    # top-16 of the prompt's picks per layer
    assert s["done"].stats.tokens >= autoprofile.MIN_TOKENS
    assert s["done"].stats.hit_rate > 0                                   # the cache served from the first token
    assert "slots planned from your first prompt: 16 of 64 per layer" in s["notices"]


def test_first_session_saves_the_profile(first_session: dict) -> None:
    t = read_csv(first_session["saved"])
    assert t.decode_tokens == first_session["done"].stats.tokens
    assert (t.pos >= 0).all()                                            # decode rows only
    assert t.meta["model"] == "moeslots-tiny-glm4moe.gguf" and t.meta["n_expert"] == "64"
    assert any("profile for this model saved" in n for n in first_session["notices"])


def test_second_session_starts_with_the_saved_profile(first_session: dict, model: Path) -> None:
    saved = first_session["saved"]
    before = read_csv(saved).decode_tokens
    e = _engine(model)
    try:
        assert e.cfg.profile == saved
        assert any(n.startswith("using the profile saved for this model") for n in e.notices)
        assert e.state.plan.slots_per_layer == 16                             # planned at load, from the profile
        assert e.state.plan == plan_from_profile(e.model, saved, 16, pack_host=True)
        at_load = e.state.plan
        done = _reply(e)
        assert e.state.plan == at_load                                        # no first-prompt plan over it
    finally:
        e.close()
    after = read_csv(saved)
    assert after.decode_tokens == before + done.stats.tokens             # merged: what was there + this session


def test_a_short_session_never_replaces_the_profile(first_session: dict, model: Path) -> None:
    saved = first_session["saved"]
    text = saved.read_bytes()
    e = _engine(model)
    try:
        _reply(e, max_tokens=8)                                          # fewer than MIN_TOKENS: nothing saved
    finally:
        e.close()
    assert saved.read_bytes() == text


def test_a_damaged_profile_is_moved_aside_not_used(model: Path, data_home: Path, first_session: dict) -> None:
    saved = first_session["saved"]
    keep = saved.read_bytes()
    try:
        saved.write_text("pos,layer,id0\nnot,a,row\n")
        e = _engine(model, max_tokens=4)
        try:
            assert e.cfg.profile is None and e._auto is not None and e._auto.plan_first_prompt
        finally:
            e.close()
        assert saved.with_suffix(".damaged.csv").read_text().endswith("not,a,row\n")
    finally:
        saved.write_bytes(keep)


def test_an_explicit_profile_wins(model: Path, data_home: Path, tmp_path: Path, first_session: dict) -> None:
    mine = tmp_path / "mine.csv"
    shutil.copyfile(bundled.profile("code"), mine)
    text = first_session["saved"].read_bytes()
    e = _engine(model, profile=mine)
    try:
        assert e._auto is None and e.cfg.profile == mine
        assert not any("profile saved for this model" in n or "no profile for" in n for n in e.notices)
        _reply(e)
    finally:
        e.close()
    assert first_session["saved"].read_bytes() == text


def test_without_slots_it_records_only(model: Path, data_home: Path, tmp_path: Path) -> None:
    """No GPU and no slots asked: nothing is planned, the profile is still recorded for a later session."""
    other = tmp_path / "no-slots.gguf"
    shutil.copyfile(model, other)
    e = _engine(other, slots=0)
    try:
        assert any("recording one to" in n and "no slots planned" in n for n in e.notices)
        done = _reply(e)
        assert not e.state.plan.layers
    finally:
        e.close()
    assert read_csv(autoprofile.saved_path(other)).decode_tokens == done.stats.tokens >= autoprofile.MIN_TOKENS


def test_the_key_follows_the_file(tmp_path: Path, model: Path) -> None:
    copy = tmp_path / model.name
    shutil.copyfile(model, copy)
    assert autoprofile.model_key(copy) == autoprofile.model_key(model)     # same name, size and header
    data = bytearray(copy.read_bytes())
    i = data.index(b"moeslots")                                            # a byte of the header (general.name)
    data[i] ^= 0x20
    copy.write_bytes(bytes(data))
    assert autoprofile.model_key(copy) != autoprofile.model_key(model)
    renamed = tmp_path / "other.gguf"
    shutil.copyfile(model, renamed)
    assert autoprofile.model_key(renamed) != autoprofile.model_key(model)


def test_a_saved_profile_keeps_the_newest_tokens() -> None:
    from moeslots.profiles.trace import Trace

    n_tok, layers = 50, 3
    pos = np.repeat(np.arange(n_tok), layers)
    t = Trace(pos.astype(np.int64), np.tile(np.arange(layers), n_tok).astype(np.int32),
              np.zeros((n_tok * layers, 2), np.int32), {"tokens": "50"})
    cut = autoprofile._newest(t, 20)
    assert cut.decode_tokens == 20 and int(cut.pos[0]) == 30 and cut.meta["tokens"] == "20"
    assert autoprofile._newest(t, 100) is t
