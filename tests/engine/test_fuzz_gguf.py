"""Hypothesis: one header value of a valid tiny GGUF replaced by another of the same type (a number, a float incl.
NaN/inf, a flipped bool, a string's bytes, an element of a number array) never crashes the process that loads it
and chats: the engine opens it or refuses it with one line (tests/probe_load.py, one subprocess per example).
MOESLOTS_FUZZ=N runs N times the examples (CI: 1)."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import ggufs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from probe_load import run as probe

_INT_RANGE = {"B": (0, 2**8 - 1), "b": (-2**7, 2**7 - 1), "H": (0, 2**16 - 1), "h": (-2**15, 2**15 - 1),
              "I": (0, 2**32 - 1), "i": (-2**31, 2**31 - 1), "Q": (0, 2**64 - 1), "q": (-2**63, 2**63 - 1)}


def values_for(slot: ggufs.Slot) -> st.SearchStrategy:
    """Another value of the slot's type, boundaries (llama.cpp's limits, off by one, 0, max) weighted in."""
    code = slot.fmt[-1]
    if slot.fmt == "s":
        return st.binary(min_size=slot.size, max_size=slot.size)
    if code == "?":
        return st.just(not slot.value)
    if code in "fd":
        return st.floats(width=32 if code == "f" else 64, allow_nan=True, allow_infinity=True)
    lo, hi = _INT_RANGE[code]
    v = int(slot.value)                                                   # type: ignore[call-overload]
    edges = {0, 1, 2, v - 1, v + 1, 2 * v, v // 2, 511, 512, 513, 1023, 1024, 1025, hi, lo, hi // 2 + 1}
    return st.one_of(st.sampled_from(sorted(e for e in edges if lo <= e <= hi and e != v)), st.integers(lo, hi))


@pytest.mark.slow
@pytest.mark.parametrize("fixture,examples", [("tiny_glm", 30), ("tiny_ds2", 20), ("tiny_q35", 20)])
def test_one_corrupted_header_value_never_crashes(request: pytest.FixtureRequest, tmp_path: Path, fixture: str,
                                                  examples: int) -> None:
    src: Path = request.getfixturevalue(fixture)
    slots = [s for s in ggufs.slots(src) if s.key != "moeslots.synth.spec"]   # a repr the engine never reads
    out = tmp_path / "fuzz.gguf"

    @settings(max_examples=examples * int(os.environ.get("MOESLOTS_FUZZ", "1")), deadline=None, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(data=st.data())
    def one(data: st.DataObject) -> None:
        slot = data.draw(st.sampled_from(slots), label="value")
        value = data.draw(values_for(slot), label=f"{slot.key} (was {slot.value!r})")
        if slot.fmt != "s" and struct.pack(slot.fmt, value) == struct.pack(slot.fmt, slot.value):
            return                                                        # the same bytes: not a corruption
        probe(ggufs.write_with(src, out, slot, value), timeout=60)

    one()
