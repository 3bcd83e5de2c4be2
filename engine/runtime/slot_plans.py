"""From a profile to a slot plan, and the lines that explain slots to the user (--slots auto, the slots dialog).

The plan is profiles.plan's rule (per trunk MoE layer the top-S decode experts of the profile) on a profile checked
against the model (engine.profilecheck); "auto" is the most slots whose packs fit the GPU's free memory minus 1 GiB.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Union

from ...profiles.costs import CostModel
from ...profiles.plan import auto_slots, plan_from_counts
from ...profiles.profile import from_trace, overlap
from ...profiles.simulate import simulate
from ...profiles.trace import TraceError, read_csv
from ..errors import EngineError
from ..llm.model import Model
from ..native import expert_cache
from ..native import lib as native
from ..native.expert_cache import SlotPlan
from .profilecheck import read_for


def trunk_layers(model: Model) -> list[int]:
    """The MoE layers whose experts can sit in slots (not the NextN block's)."""
    f = model.facts
    return [il for il in f.moe_layers if il < f.n_layer]


def plan_from_profile(model: Model, profile: Path, slots: Union[int, str], *, pack_host: bool = False,
                      notices: list[str] | None = None, spare: bool = False) -> SlotPlan:
    """Per trunk MoE layer the top-`slots` decode experts of the profile; "auto": the most slots whose packs fit the
    GPU's free memory minus 1 GiB. A profile of another model is refused naming both shapes; one without decode rows
    says so in `notices` (engine.profilecheck)."""
    counts = from_trace(read_for(model, profile, notices), model.n_layer_all, model.facts.n_expert).counts
    n = slot_count(model, slots, pack_host=pack_host, spare=spare)
    return SlotPlan(plan_from_counts(counts, n, trunk_layers(model)))


def slot_count(model: Model, slots: Union[int, str], *, pack_host: bool = False, spare: bool = False) -> int:
    """Slots per layer for a plan: a number (checked), or "auto": the most whose packs (with a spare slab per layer
    when `spare`: slots that move) fit the GPU's free memory minus 1 GiB (half the experts with packs in host
    memory)."""
    f = model.facts
    if slots == "auto":
        if pack_host:
            return f.n_expert // 2
        gpus = native.gpus()
        if not gpus:
            raise EngineError("--slots auto: no GPU, so no slots (experts run on the CPU)")
        return auto_slots(max(g.free for g in gpus), len(trunk_layers(model)), f.slab_bytes, f.n_expert,
                          spare=spare)
    try:
        n = int(slots)
    except ValueError:
        raise EngineError(f"--slots takes a number or 'auto', not {slots!r}") from None
    if not 0 <= n <= f.n_expert:
        raise EngineError(f"--slots {n}: give 0 (no slots) to {f.n_expert} (every expert of a layer), or auto")
    return n


def explain(model: Model, plan: SlotPlan, *, pack_host: bool, profile: Path | None,
            costs: Callable[[], tuple[CostModel, str]], auto: bool = False) -> str:
    """One line on the slot count in use: what fits (auto: why that many), what the active profile predicts."""
    s = plan.slots_per_layer
    f = model.facts
    b = expert_cache.pack_bytes(model.ptr)
    size = f"{b / 2**30:.1f} GiB" if b >= 2**30 else f"{b / 2**20:.1f} MiB"
    where = f"host memory (no GPU), {size}" if pack_host else f"{size} of VRAM"
    line = f"slots: {s} of {f.n_expert} per layer in {where}"
    if auto:
        line += (" (auto without a GPU: half the experts, so the inspector shows the cache at work; in host memory "
                 "they are computed on the CPU like the rest: no speed-up)" if pack_host else
                 " (auto: the most that fit the GPU's free memory less 1 GiB)")
    if profile is None or not s:
        return line
    cost, source = costs()
    try:
        r = simulate(read_csv(Path(profile)), s, ["static-profile"], cost=cost)[0]
    except (TraceError, ValueError):
        return line
    return (f"{line}; the profile predicts {100 * r.hit_rate:.0f} % of picks served from slots, est. "
            f"{r.ms_per_token:.1f} ms/token [{source}]")


def info(model: Model, *, pack_host: bool) -> str:
    """One line for the slots dialog: bytes per slot, the pack now, what the free VRAM would hold."""
    f = model.facts
    layers = trunk_layers(model)
    per_slot = f.slab_bytes * len(layers)
    line = (f"one slot per layer = {per_slot / 2**20:.0f} MiB; "
            f"pack now {expert_cache.pack_bytes(model.ptr) / 2**20:.0f} MiB")
    gpus = [] if pack_host else native.gpus()
    if gpus and per_slot:
        free = max(g.free for g in gpus) + expert_cache.pack_bytes(model.ptr)   # the old pack is freed first
        line += f"; fits up to {auto_slots(free, len(layers), f.slab_bytes, f.n_expert)} (auto)"
    elif pack_host:
        line += "; no GPU: slots live in host memory"
    return line


def profile_overlap(model: Model, plan: SlotPlan, active: Path | None, other: Path) -> float | None:
    """Mean per-layer overlap of the top-S sets of `other` and the `active` profile at the plan's S."""
    if active is None or not plan.layers:
        return None
    s = plan.slots_per_layer
    a = from_trace(read_csv(Path(active)), model.n_layer_all, model.facts.n_expert)
    b = from_trace(read_csv(Path(other)), model.n_layer_all, model.facts.n_expert)
    layers = list(plan.layers)
    return float(overlap(a, b, s)[layers].mean()) if s else None
