"""The residency policy (`--policy static|hybrid|dynamic|fetch|fetch-split|auto`): how many of a layer's S slots are
a dynamic tier (profiles.hybrid), how its misses are served (hybrid and dynamic: split between the CPU and uploads by
cost, one host round trip per layer; fetch: the tier stepped on the GPU, every miss fetched from pinned memory by the
GPU, no round trip; fetch-split: the GPU fetches part of each layer's misses and the CPU computes the others beside
its copies), and `auto`'s choice among them, simulated with the engine's mechanisms under a cost model."""

from __future__ import annotations

import dataclasses
from typing import Sequence

from .costs import CostModel
from .hybrid import ENGINE, FETCH, FETCH_SPLIT, HybridResult, Mechanism, core_and_tier, simulate_hybrid
from .repick import Picks, _picks
from .simulate import layer_counts
from .trace import Trace

POLICIES = ("static", "hybrid", "dynamic", "fetch", "fetch-split", "auto")
GPU_STEPPED = ("fetch", "fetch-split")     # the tier stepped on the GPU: experts in pinned memory, slots on a GPU
TIERED = ("hybrid", "dynamic") + GPU_STEPPED          # a dynamic tier beside the static core
TIER_SIZED = ("hybrid",) + GPU_STEPPED                # --tier D sizes it (dynamic: every slot)
SPLIT_BY_COST = ("hybrid", "dynamic", "fetch-split")  # misses split between the CPU and copies by this machine's costs
MAX_SCORED = 512          # tokens `auto` scores (the last ones of the profile): a load-time decision, kept short
# A GPU-stepped tier's sizes the simulator cannot tell apart (within this share of the best estimate) go to the
# fewest tier slots: its step seems to cost GPU time a tier slot a layer that the model does not count. On the GPU
# box (H100, 2026-12-07) the split with fewer tier slots ran faster than predicted against the other in all six pairs
# of rows of one policy, 0.2-0.7 µs a tier slot a layer, each pair one reading (docs/lab/2026-12-07-worker-openmp.md,
# section 6). Provisional: the margin is not derived from the data; a measured cost a slot replaces it.
TIER_NEAR = 0.01


@dataclasses.dataclass(frozen=True)
class Policy:
    """A residency policy as asked (`--policy NAME`, `--tier D`), parsed once where it enters (the command line, the
    config file, EngineConfig) and read by what it means from then on: whether slots move, who steps the tier,
    whether the CPU takes a share of the misses."""
    name: str = "static"        # one of POLICIES
    tier: int | None = None     # dynamic slots per layer asked for (--tier); None: the policy's default

    def __post_init__(self) -> None:
        if self.name not in POLICIES:
            raise ValueError(f"--policy takes {', '.join(POLICIES)}, not {self.name!r}")
        if self.tier is not None and self.name not in TIER_SIZED:
            raise ValueError(f"--tier D sets the dynamic slots of --policy {', '.join(TIER_SIZED)}, not {self.name}")
        if self.tier is not None and self.tier < 0:
            raise ValueError(f"--tier {self.tier}: a tier is 0 or more slots")

    @classmethod
    def parse(cls, value: "Policy | str | None", tier: int | None = None) -> "Policy":
        """`value` as a Policy: a name (with `tier`), a Policy as is (a `tier` given too must agree), None: static."""
        if isinstance(value, Policy):
            if tier is not None and tier != value.tier:
                raise ValueError(f"--tier {tier} beside a policy that asks for {value.tier}")
            return value
        return cls("static" if value is None else str(value), tier)

    def __str__(self) -> str:
        return self.name

    @property
    def is_auto(self) -> bool:
        return self.name == "auto"

    @property
    def moves_slots(self) -> bool:
        """Whether this policy moves slots itself (every policy but static may): re-picks cannot run beside it."""
        return self.name != "static"

    @property
    def gpu_stepped(self) -> bool:
        """The GPU steps the tier and reads every miss it fetches from pinned host memory (fetch, fetch-split)."""
        return self.name in GPU_STEPPED

    @property
    def cpu_share(self) -> bool:
        """The CPU computes a share of a GPU-stepped tier's misses beside the copies (fetch-split)."""
        return self.name == "fetch-split"

    def check_repick(self, repick_every: int) -> None:
        """Re-picks and a moving policy both move slots: one of them."""
        if self.moves_slots and repick_every > 0:
            raise ValueError(f"--policy {self.name} and --repick both move slots: choose one")

    def tier_for(self, slots: int, used: int = 0) -> int:
        """Dynamic slots per layer of `slots` under this policy (auto is decided first: tier_slots)."""
        return tier_slots(self.name, slots, self.tier, used)


STATIC = Policy()


def tier_slots(policy: str, slots: int, tier: int | None = None, used: int = 0) -> int:
    """Dynamic slots per layer of `slots` under a policy: static 0, dynamic all, hybrid `tier` (default S/4, at
    least 1 when there are slots), fetch and fetch-split `tier` (default S/2, at least one token's `used` experts: a
    GPU-stepped tier moves only in batches whose picks fit in it)."""
    if policy not in POLICIES or policy == "auto":
        raise ValueError(f"policy {policy!r}: one of static, hybrid, dynamic, fetch, fetch-split"
                         + (" (auto is decided first)" if policy == "auto" else ""))
    if policy == "static" or slots <= 0:
        return 0
    if policy == "dynamic":
        return slots
    gpu = policy in GPU_STEPPED
    default = min(slots, max(1, slots // 2, used)) if gpu else max(1, slots // 4)
    d = default if tier is None else tier
    if not 0 <= d <= slots:
        raise ValueError(f"a tier of {d} slots: the layer has {slots}")
    if gpu and d < used:
        raise ValueError(f"a tier of {d} slots holds fewer than one token's {used} experts, so the GPU would never "
                         f"step it: " + (f"give --tier {used} or more (of {slots})" if slots >= used else
                                        f"{policy} needs at least {used} slots per layer, not {slots}"))
    return d


def name(slots: int, tier: int) -> str:
    return "static" if tier == 0 or slots == 0 else "dynamic" if tier == slots else "hybrid"


@dataclasses.dataclass(frozen=True)
class Scored:
    policy: str              # static, hybrid, dynamic, fetch, fetch-split
    tier: int                # dynamic slots per layer
    ms_per_token: float      # estimated
    hit_rate: float


_FAMILY = {"dynamic": "hybrid"}     # policies that are one mechanism with another split of the slots


@dataclasses.dataclass(frozen=True)
class Decision:
    policy: str
    tier: int
    why: str                            # one line: the choice, its estimate and the runner-up's
    ranked: tuple[Scored, ...] = ()     # every scored choice, fastest first (static always among them)

    @property
    def predicted_ms(self) -> float:
        return next((r.ms_per_token for r in self.ranked if (r.policy, r.tier) == (self.policy, self.tier)), 0.0)

    def runner_up(self) -> Scored | None:
        """The fastest other mechanism: another tier size of the same policy is no second opinion, and neither is
        the host tier with another core (dynamic is hybrid with none)."""
        same = _FAMILY.get(self.policy, self.policy)
        return next((r for r in self.ranked if _FAMILY.get(r.policy, r.policy) != same), None)


def choose_policy(trace: "Trace | Picks", slots: int, cost: CostModel | None = None, *,
                  tiers: Sequence[int] | None = None, mech: Mechanism = ENGINE, holdout: float = 0.5,
                  min_gain: float = 0.05, max_scored: int = MAX_SCORED, fetch: bool = False,
                  share: bool = False) -> tuple[str, int, str]:
    """decide_policy's (policy, tier slots, one line saying why)."""
    d = decide_policy(trace, slots, cost, tiers=tiers, mech=mech, holdout=holdout, min_gain=min_gain,
                      max_scored=max_scored, fetch=fetch, share=share)
    return d.policy, d.tier, d.why


def decide_policy(trace: "Trace | Picks", slots: int, cost: CostModel | None = None, *,
                  tiers: Sequence[int] | None = None, mech: Mechanism = ENGINE, holdout: float = 0.5,
                  min_gain: float = 0.05, max_scored: int = MAX_SCORED, fetch: bool = False,
                  share: bool = False) -> Decision:
    """`--policy auto`: the tier size (0 = static) with the lowest estimated ms/token, the rule run with the engine's
    mechanism (each token's misses split between the CPU and uploads now by cost; no prefetch). As choose_repick: the
    core comes from the first part of the profile and every choice is scored on its last part (at most `max_scored`
    tokens), a tier only when it is estimated `min_gain` faster than static. Deterministic. Returns (policy, tier
    slots, one line saying why). fetch: the GPU-stepped tier is possible here (experts in pinned memory, slots on a
    GPU): its tiers are scored too, with the FETCH and (share: the machine's cost of a CPU share is known) the
    FETCH_SPLIT mechanisms, and win as "fetch" or "fetch-split"."""
    cost = cost or CostModel()
    pk = _picks(trace)
    P, layers, n_expert = pk.P, pk.layers, pk.n_expert
    if slots <= 0:
        return Decision("static", 0, "static: no slots, no tier")
    T = P.shape[0]
    cut = int(round(T * (1 - holdout)))
    split = 0 < holdout < 1 and min(cut, T - cut) >= 128
    train, test = (P[:cut], P[cut:]) if split else (P, P)
    test = test[-max_scored:]
    counts = layer_counts(train, layers, n_expert)[layers]
    ds = sorted({0, max(1, slots // 4), slots // 2, slots} if tiers is None else {0, *tiers})
    results = []
    for d in ds:
        core, first = core_and_tier(counts, slots, d)
        results.append((simulate_hybrid(test, core, d, cost, initial=first, mech=mech), d, name(slots, d)))
    if fetch:
        k = int(P.shape[2]) if P.ndim == 3 else 1
        for d in sorted(d for d in {max(1, slots // 4), slots // 2, slots} if d >= k):
            core, first = core_and_tier(counts, slots, d)
            for pol, m in (("fetch", FETCH), ("fetch-split", FETCH_SPLIT))[:2 if share else 1]:
                results.append((simulate_hybrid(test, core, d, cost, initial=first, mech=m), d, pol))
    static = results[0][0]
    ranked = tuple(Scored(pol, d, r.ms_per_token, r.hit_rate)
                   for r, d, pol in sorted(results, key=lambda x: (x[0].ms_per_token, x[1], x[2])))
    best, d, pol = min(results[1:], key=lambda r: (r[0].ms_per_token, r[1], r[2]), default=results[0])
    gain = 1 - best.ms_per_token / static.ms_per_token if static.ms_per_token > 0 else 0.0
    scored = (f"core from the profile's first {cut} tokens, scored on {len(test)} later ones" if split
              else f"profile of {T} tokens scored in-sample")
    if d == 0 or gain < max(min_gain, 1e-9):
        return Decision("static", 0, (
            f"static: {100 * static.hit_rate:.0f} % hits at {slots} slots, est. {static.ms_per_token:.2f} ms/token; "
            f"the best tier ({pol}, {d} slots, est. {best.ms_per_token:.2f}) "
            f"{'saves' if gain > 0 else 'would save'} {100 * max(gain, 0):.1f} %, under {100 * min_gain:.0f} % "
            f"({scored}; uploads {cost.pcie_gbps:.1f} GB/s"
            f"{', from pageable memory: they add to the CPU part' if cost.serial_uploads else ''}, "
            f"CPU {cost.cpu_gbps:.1f} GB/s)"), ranked)
    near = ""                                           # (the gain above is the best estimate's, before this)
    fewest = fewest_near(results[1:], best.ms_per_token, pol) if pol in GPU_STEPPED else None
    if fewest is not None and fewest[1] < d:
        near = f"; {d} tier slots est. {best.ms_per_token:.2f}, within {100 * TIER_NEAR:.0f} %: the fewest kept"
        best, d, pol = fewest
        gain = 1 - best.ms_per_token / static.ms_per_token
    second = Decision(pol, d, "", ranked).runner_up()      # the one auto's self-check would try
    return Decision(pol, d, (
        f"{pol}: {slots - d} core + {d} tier slots, {100 * best.hit_rate:.0f} % hits (static "
        f"{100 * static.hit_rate:.0f} %), est. {best.ms_per_token:.2f} ms/token"
        + (f", runner-up {second.policy} {second.ms_per_token:.2f}" if second else "")
        + f", static {static.ms_per_token:.2f}: {100 * gain:.0f} % faster ({scored}{near})"), ranked)


def fewest_near(results: Sequence[tuple[HybridResult, int, str]], best_ms: float,
                pol: str) -> tuple[HybridResult, int, str] | None:
    """Of `pol`'s scored tier sizes (simulation result, tier slots, policy), the fewest tier slots estimated within
    TIER_NEAR of best_ms (None: none of them)."""
    near = [r for r in results if r[2] == pol and r[0].ms_per_token <= best_ms * (1 + TIER_NEAR)]
    return min(near, key=lambda r: r[1], default=None)
