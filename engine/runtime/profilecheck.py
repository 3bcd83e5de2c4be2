"""A profile (routing trace CSV) checked against the loaded model before it plans the slots.

The shape must match in both directions: a profile recorded on a model with more layers or experts would index past
this one's, and one from a model with fewer would plan from the wrong routing without a word. A profile's `#` line
declares its model's shape; a file without it (the thecodacus fork's format) must at least fit this model. A profile
with no decode rows (only prompt rows: a recording stopped before the first token) plans an even spread: said once.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ...profiles.trace import Trace, TraceError, read_csv
from ..errors import EngineError

if TYPE_CHECKING:
    from ..llm.model import Model


def read_for(model: "Model", profile: Path, notices: list[str] | None = None) -> Trace:
    """The profile's trace, or EngineError naming both shapes when it was recorded on another model. A notice goes to
    `notices` (once) when it has no decode rows."""
    try:
        t = read_csv(profile)
    except TraceError as e:
        raise EngineError(str(e)) from None
    mismatch = shape_mismatch(model, t)
    if mismatch:
        f = model.facts
        raise EngineError(f"{profile} was recorded on another model ({t.meta.get('arch', '?')}, {t.shape_text()}); "
                          f"this one is {f.arch}, {model.n_layer_all} layers x {f.n_expert} experts, "
                          f"k={f.n_expert_used} ({mismatch})")
    if notices is not None and not t.decode_tokens:
        line = (f"{profile} has no decode rows ({'only prompt rows' if t.n_rows else 'no rows at all'}): the slots "
                "are spread evenly over the experts, not chosen by the profile")
        if line not in notices:
            notices.append(line)
    return t


def shape_mismatch(model: "Model", t: "Trace") -> str:
    """Why trace `t` does not fit `model` ("" when it does): declared facts must be equal, rows must fit."""
    f = model.facts
    want = {"arch": f.arch, "n_layer": model.n_layer_all, "n_expert": f.n_expert, "k": f.n_expert_used}
    for key, v in want.items():
        have = t.meta.get(key)
        if have is not None and str(have) != str(v):
            return f"{key}: {have} in the profile, {v} in the model"
    if t.n_rows and t.k != f.n_expert_used:
        return f"k: {t.k} experts per row in the profile, {f.n_expert_used} in the model"
    if t.n_rows and int(t.layer.max()) >= model.n_layer_all:
        return f"it routes layer {int(t.layer.max())}; the model has {model.n_layer_all}"
    if t.n_rows and int(t.ids.max()) >= f.n_expert:
        return f"it routes expert {int(t.ids.max())}; the model has {f.n_expert}"
    return ""
