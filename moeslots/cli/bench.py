"""`moeslots bench decode|compare|mtp|repick|app MODEL ...`: the engine measured, one subcommand per benchmark, each
with only its own flags (engine/bench/: decode.py, mtp.py, repick.py; the app beside the engine: tui/appbench.py).

    decode   prompt and decode tok/s, hit rate, weight MB/token to the GPU, splits and routing at each slot count
    compare  greedy text at each slot count against 0 slots (the cache must not change it)
    mtp      greedy tok/s with and without MTP drafts, acceptance, ms per phase of a step
    repick   static vs re-pick every N tokens (and live auto), and the residency policies (--policy static,hybrid,
             dynamic,auto), under replayed routing, beside the simulator
    app      the real app driven headless beside the same engine alone
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from . import bench_app
from .common import UserError, int_list

SLOTS = "0,16,32,64,96,128"


def _engine_setup(a: argparse.Namespace) -> list[int]:
    """What every engine benchmark does first: the engine checked, --slots read, the host-chain overlap set."""
    from ..engine.native import expert_cache
    from ..engine.native import lib as native

    native.require_patched()
    slots = int_list(a.slots, "--slots")
    if any(n < 0 for n in slots):
        raise UserError(f"--slots takes numbers >= 0 (slots per layer), got {a.slots!r}")
    expert_cache.set_async(a.async_cpu)
    print(f"host chain overlaps the GPU chain: {'yes (--async-cpu)' if expert_cache.async_enabled() else 'no'}",
          file=sys.stderr)
    return slots


def _write_json(path: str | None, data: object) -> None:
    if path:
        Path(path).write_text(json.dumps(data, indent=1))


def cmd_decode(a: argparse.Namespace) -> int:
    from ..engine.bench import decode

    slots = _engine_setup(a)
    rows, info = decode.run(Path(a.model), slots, n_decode=a.n_decode, prompt_len=a.prompt_len, threads=a.threads,
                            mmap=not a.no_mmap, pack_host=a.pack_host, with_stats=not a.no_stats,
                            replay_from=a.replay, op_offload=not a.no_op_offload, all_gpu=a.all_gpu,
                            timing=a.timing, log=lambda m: print(m, file=sys.stderr))
    print(decode.render(rows, info))
    if a.timing:
        print("\nwhere a decode token's time went (the scheduler's clock, ms per token):\n" + decode.TIMING_HEADER)
        print("\n".join(decode.render_timing(r.slots, r.timing)[len("timing per token, ms: "):]
                        for r in rows if r.timing))
    if a.json:
        decode.save(rows, info, Path(a.json))
    return 0


def cmd_compare(a: argparse.Namespace) -> int:
    from ..engine.bench import decode

    slots = _engine_setup(a)
    rows = decode.compare(Path(a.model), slots, prompts=a.prompts, tokens=a.tokens, threads=a.threads,
                          mmap=not a.no_mmap, pack_host=a.pack_host, replay_from=a.replay,
                          log=lambda m: print(m, file=sys.stderr))
    print("\n".join([decode.COMPARE_HEADER] + [decode.render_compare_row(r) for r in rows]))
    _write_json(a.json, [dataclasses.asdict(r) for r in rows])
    return 0


def cmd_mtp(a: argparse.Namespace) -> int:
    from ..engine.bench import drafts as mtp

    slots = _engine_setup(a)
    drafts = int_list(a.drafts, "--drafts")
    print("| slots/layer | draft | plain tok/s | MTP tok/s | acceptance | tokens/step | same greedy text | "
          "ms per step: feed / drafts / verify / rest |")
    print("|---|---|---|---|---|---|---|---|")
    try:
        text = Path(a.prompt_file).read_text(encoding="utf-8") if a.prompt_file else None
        rows = mtp.run_mtp(Path(a.model), slots, drafts, n_tokens=a.n_decode, threads=a.threads,
                           pack_host=a.pack_host, prompt_text=text, mtp_head=a.mtp_head, replay_from=a.replay,
                           mmap=not a.no_mmap, log=print)
    except ValueError as e:
        raise UserError(str(e)) from None
    _write_json(a.json, [dataclasses.asdict(r) for r in rows])
    return 0


def cmd_repick(a: argparse.Namespace) -> int:
    from ..engine.bench import policies as repick
    from ..engine.bench import tier
    from ..engine.llm.facts import inspect_gguf
    from ..engine.llm.model import default_threads
    from ..engine.machine import autocal, calibrate
    from ..profiles.policy import GPU_STEPPED, POLICIES

    if a.every is None and a.policy is None:
        raise UserError("bench repick needs --every N1,N2|auto and/or --policy "
                        "static,hybrid,dynamic,fetch,fetch-split,auto")
    words = [x.strip() for x in (a.every or "").split(",") if x.strip()]
    if a.every is not None and (not words or not all(x == "auto" or x.isdigit() for x in words)):
        raise UserError(f"--every takes intervals >= 0 (0: static) or auto, not {a.every!r}")
    policies = [x.strip() for x in (a.policy or "").split(",") if x.strip()]
    if a.policy is not None and (not policies or not set(policies) <= set(POLICIES) | {"default"}):
        raise UserError(f"--policy takes {','.join(POLICIES)},default (comma-separated), not {a.policy!r}")
    if a.policy is not None and (a.profile_from or a.max_swaps != 4 or a.overlap) and not words:
        raise UserError("--profile-from, --max-swaps and --overlap are re-pick flags (--every)")
    if a.reps < 1:
        raise UserError(f"--reps takes a count >= 1, not {a.reps}")
    gpu = [p for p in policies if p in GPU_STEPPED]
    if gpu and not (a.no_mmap or a.pack_host):
        raise UserError(f"--policy {gpu[0]}: the GPU reads missed experts from pinned host memory; add --no-mmap")
    slots = _engine_setup(a)
    intervals = [repick.AUTO if x == "auto" else int(x) for x in words]
    facts = inspect_gguf(Path(a.model))
    cost, source = calibrate.costs_for(facts.slab_bytes, pinned=a.no_mmap, threads=a.threads or default_threads(),
                                       shape=autocal.shape_of(facts))
    routings = [r for r in a.replay.split(",") if r.strip()]
    print(f"cost model for the simulator: {source}")
    out: dict = {}
    try:
        if intervals:
            print(repick.REPICK_HEADER)
            rows, info = repick.run_repick(Path(a.model), slots, intervals, routings, n_decode=a.n_decode,
                                           profile_rows=a.profile_rows, threads=a.threads, mmap=not a.no_mmap,
                                           pack_host=a.pack_host, max_swaps=a.max_swaps, cost=cost,
                                           overlap=a.overlap, profile_from=a.profile_from, log=print)
            for name, src in info["routings"].items():
                print(f"routing {name}: {src}")
            out = {"info": info, "rows": [dataclasses.asdict(r) for r in rows]}
        if policies:
            print("residency policies (the engine's tier: uploads now by cost) beside the simulator (profiles.hybrid, "
                  "the engine's mechanism):")
            print(tier.TIER_HEADER)
            used: dict[str, object] = {}
            trows = tier.run_tiers(Path(a.model), slots, policies, routings, tier=a.tier, n_decode=a.n_decode,
                                   profile_rows=a.profile_rows, threads=a.threads, mmap=not a.no_mmap,
                                   pack_host=a.pack_host, cost=None if "default" in policies else cost,
                                   reps=a.reps, log=print, used=used)
            for r in trows:
                if r.chosen:
                    print(f"{r.policy} at {r.slots} slots on {r.routing}: {r.chosen}")
            off = [r for r in trows if abs(tier.sim_error(r)) > tier.OFF]
            offs = ", ".join(f"{r.routing} {r.slots} {r.policy} {100 * tier.sim_error(r):+.0f} %" for r in off)
            print(f"predicted vs measured ms/token: {len(trows) - len(off)} of {len(trows)} rows within "
                  f"{100 * tier.OFF:.0f} %" + (": off " + offs if off else ""))
            out["policies"] = [dataclasses.asdict(r) for r in trows]
            out["policy_costs"] = used
    except ValueError as e:
        raise UserError(str(e)) from None
    _write_json(a.json, out)
    return 0


def _common(p: argparse.ArgumentParser, *, slots: str = SLOTS) -> None:
    p.add_argument("model")
    p.add_argument("--slots", default=slots, help="comma-separated slots per layer")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--no-mmap", action="store_true", help="load experts into (pinned) host memory, not mmap")
    p.add_argument("--pack-host", action="store_true", help="hot packs in host memory (CPU-only testing)")
    p.add_argument("--async-cpu", action=argparse.BooleanOptionalAction, default=False,
                   help="host chain overlapping the GPU chain (patch 0002; off by default: no gain measured on the "
                   "H200 box)")
    p.add_argument("--json", help="also write the rows as JSON")


def _replay(p: argparse.ArgumentParser) -> None:
    p.add_argument("--replay", metavar="TRACE|uniform",
                   help="route through a recorded trace (CSV) or uniform random ids instead of the router")


def add_parsers(sub: argparse._SubParsersAction) -> None:
    bn = sub.add_parser("bench", help="measure the engine (decode, compare, mtp, repick) or the app (app)",
                        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bs = bn.add_subparsers(dest="bench_cmd", metavar="BENCHMARK", required=True)

    d = bs.add_parser("decode", help="decode/prompt speed, hit rate and uploads at several slot counts")
    _common(d)
    d.add_argument("-n", "--n-decode", type=int, default=128, help="timed decode tokens (random, teacher-forced)")
    d.add_argument("--prompt-len", type=int, default=512)
    d.add_argument("--no-stats", action="store_true", help="native routing stats off (to measure their cost)")
    d.add_argument("--no-op-offload", action="store_true",
                   help="prompt batches compute the experts that are not in slots on the CPU instead of streaming "
                        "them to the GPU (llama.cpp's op-offload, batches >= 32)")
    d.add_argument("--all-gpu", action="store_true",
                   help="every expert on the GPU, no cache (stock llama.cpp): the reference for full residency")
    d.add_argument("--timing", action="store_true",
                   help="where each decode token's time goes: per split kind (CPU, GPU) the time waiting for the "
                        "other backend, copying inputs and computing (CPU) or launching (GPU)")
    _replay(d)
    d.set_defaults(func=cmd_decode)

    c = bs.add_parser("compare", help="greedy text at each slot count against 0 slots")
    _common(c)
    c.add_argument("--prompts", type=int, default=4, help="random 32-token starts")
    c.add_argument("--tokens", type=int, default=256, help="greedy tokens from each start")
    _replay(c)
    c.set_defaults(func=cmd_compare)

    m = bs.add_parser("mtp", help="greedy tok/s with and without MTP drafts, acceptance, time per phase")
    _common(m)
    m.add_argument("--drafts", default="1", metavar="D1,D2", help="draft lengths (default 1)")
    m.add_argument("-n", "--n-decode", type=int, default=128, help="greedy tokens per run")
    m.add_argument("--mtp-head", default="gpu", choices=["slots", "host", "gpu"],
                   help="the NextN block's experts on the GPU (default, as the app), in the plan (slots), or in host "
                   "memory")
    m.add_argument("--prompt-file", help="a user turn (chat template) instead of random prompt tokens")
    _replay(m)
    m.set_defaults(func=cmd_mtp)

    r = bs.add_parser("repick", help="static vs re-pick every N tokens, and the residency policies (static, hybrid, "
                      "dynamic, auto), under replayed routing, beside the simulator")
    _common(r)
    r.add_argument("--every", metavar="N1,N2|auto", help="re-pick intervals (0: static); 'auto': live "
                   "--repick auto (chosen from the profile rows, then again every 256 decoded tokens)")
    r.add_argument("--policy", metavar="P1,P2", help="residency policies to measure: static, hybrid (a core plus a "
                   "dynamic tier of --tier D slots), dynamic (all slots a tier), fetch (a core plus a tier stepped by "
                   "the GPU: every miss fetched from pinned memory; --no-mmap), fetch-split (the same, the CPU "
                   "computing a share of each layer's misses beside the GPU's copies), auto (chosen from the profile "
                   "rows under "
                   "the cost model), default (what `moeslots chat` does with no --policy: auto where a GPU holds the "
                   "slots, after the first-run calibration when this machine has none for the model, else static). "
                   "Each row shows the simulator's ms/token beside the measured and flags (!) an error over 10 %%")
    r.add_argument("--tier", type=int, metavar="D", help="--policy hybrid|fetch|fetch-split: dynamic slots per layer "
                   "(default S/4; fetch and fetch-split S/2)")
    r.add_argument("-r", "--reps", type=int, default=1, metavar="R",
                   help="--policy rows: measure each R times, the policies taking turns (alternating order), and "
                   "show the median tok/s with its range (default 1)")
    r.add_argument("--replay", default="uniform", metavar="TRACE,...|uniform",
                   help="the routings to replay (comma-separated traces and/or 'uniform'; default uniform)")
    r.add_argument("-n", "--n-decode", type=int, default=128, help="timed decode tokens per routing and policy")
    r.add_argument("--profile-rows", type=int, default=1024, help="trace rows that make the static plan")
    r.add_argument("--profile-from", metavar="TRACE", help="take those rows from this trace instead of the replayed "
                   "one (a profile that does not match the chat)")
    r.add_argument("--max-swaps", type=int, default=4, help="at most M swaps per layer per re-pick")
    r.add_argument("--overlap", action="store_true", help="copies staged on a worker thread while decoding, "
                   "committed between steps (as the engine does), instead of synchronous swaps")
    r.set_defaults(func=cmd_repick)

    bench_app.add_parser(bs)                   # `moeslots bench app MODEL ...`: the app beside the engine alone
