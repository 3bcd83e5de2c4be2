"""The side-by-side table: llama.cpp b11549 (llama-bench, its dynamic expert cache) and moeslots (bench repick) on
one model with the same cache bytes, from run.sh's results.

    table.py OUT_DIR                  # collect OUT_DIR/manifest.jsonl + raw/ into OUT_DIR/sidebyside.{json,md}
    table.py --json sidebyside.json   # render an already collected file (prints the Markdown)

Each row is one load mode x threads x routing x cache size; llama.cpp's columns are decode (tg) and prompt (pp)
tokens/s without and with its cache, moeslots' are decode tokens/s per policy, each with its ratio to llama.cpp's
decode with the cache of the same size (moeslots / llama.cpp).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Sequence

ROUTING_TEXT = {
    "random": "random: llama.cpp routes random tokens itself; moeslots replays uniform random rows",
    "uniform": "uniform: both replay the same uniform random rows",
}


class TableError(ValueError):
    """Missing or malformed results; the message names the file."""


def _load(path: Path) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except OSError as e:
        raise TableError(f"cannot read {path}: {e.strerror or e}") from None
    except ValueError as e:
        raise TableError(f"{path}: not JSON ({e})") from None


def moeslots_routing(label: str) -> str:
    """The routing name moeslots' rows carry for a table routing label."""
    return "uniform" if label in ("random", "uniform") else label


def hardware() -> dict[str, str]:
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = "none"
    if shutil.which("nvidia-smi"):
        try:
            r = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                               capture_output=True, text=True, timeout=30)
            gpu = "; ".join(x.strip() for x in r.stdout.splitlines() if x.strip()) or "none"
        except (OSError, subprocess.SubprocessError):
            pass
    return {"nproc": str(os.cpu_count() or 0), "cpu": cpu or "unknown", "gpu": gpu}


def _complete(path: Path) -> bool:
    """Whether a run's result file is there and whole (an interrupted run leaves it missing, empty or cut)."""
    try:
        json.loads(path.read_text())
        return True
    except (OSError, ValueError):
        return False


def collect(out: Path) -> dict[str, Any]:
    """sidebyside.json's content from run.sh's manifest and raw result files."""
    manifest = out / "manifest.jsonl"
    try:
        lines = [json.loads(x) for x in manifest.read_text().splitlines() if x.strip()]
    except OSError:
        raise TableError(f"no results in {out} (missing {manifest.name}: run run.sh first)") from None
    except ValueError as e:
        raise TableError(f"{manifest}: malformed ({e})") from None
    facts = _load(out / "facts.json")
    llama: list[dict[str, Any]] = []
    moeslots: list[dict[str, Any]] = []
    missing = [r for r in lines if not _complete(Path(r["json"]))]      # runs stopped before these, or failed
    lines = [r for r in lines if r not in missing]
    for run in lines:
        data = _load(Path(run["json"]))
        base = {"load": run["load"], "threads": int(run["threads"])}
        if run["engine"] == "llama.cpp":
            for r in data:
                test = f"pp{r['n_prompt']}" if r["n_prompt"] else f"tg{r['n_gen']}"
                llama.append({**base, "routing": run["routing"], "cache_mib": int(r.get("moe_cache_mib", 0)),
                              "test": test, "tok_s": float(r["avg_ts"]), "stddev": float(r["stddev_ts"])})
        else:
            for r in data.get("policies", []):
                moeslots.append({**base, "routing": r["routing"], "slots": int(r["slots"]), "policy": r["policy"],
                                 "tok_s": float(r["decode_tok_s"]), "hit_rate": float(r["hit_rate"]),
                                 "chosen": r.get("chosen", ""), "ms": float(r.get("ms_per_token_median", 0.0)),
                                 "sim_ms": float(r.get("sim_ms_per_token", 0.0)),
                                 "rep_ms": [float(x) for x in r.get("rep_ms", [])]})
            for r in data.get("rows", []):
                if int(r["every"]) == 0:
                    moeslots.append({**base, "routing": r["routing"], "slots": int(r["slots"]),
                                     "policy": "static (--every 0)", "tok_s": float(r["decode_tok_s"]),
                                     "hit_rate": float(r["hit_rate"]), "chosen": ""})
    llama_info = {}
    for run in lines:
        if run["engine"] == "llama.cpp":
            d = _load(Path(run["json"]))
            if d:
                llama_info = {k: d[0].get(k, "") for k in ("build_commit", "build_number", "cpu_info", "gpu_info",
                                                           "backends")}
                break
    return {"hardware": hardware(), "model": facts, "llama_bench": llama_info,
            "commands": [f"{r['engine']}: {r['cmd']}" for r in lines], "llama": llama, "moeslots": moeslots,
            "not_run": [f"{r['engine']}: {r['cmd']}" for r in missing]}


def _fmt(x: float | None) -> str:
    return "–" if x is None else (f"{x:.0f}" if x >= 100 else f"{x:.1f}")


def render(d: dict[str, Any]) -> str:
    m, hw = d["model"], d["hardware"]
    llama: list[dict[str, Any]] = d["llama"]
    ours: list[dict[str, Any]] = d["moeslots"]
    policies = list(dict.fromkeys(r["policy"] for r in ours))
    cache_of = {int(s): int(v) for s, v in m.get("cache_mib", {}).items()}

    def lk(load: str, t: int, routing: str, mib: int, test: str) -> float | None:
        for r in llama:
            if (r["load"], r["threads"], r["routing"], r["cache_mib"], r["test"]) == (load, t, routing, mib, test):
                return float(r["tok_s"])
        return None

    def ok(load: str, t: int, routing: str, slots: int, pol: str) -> dict[str, Any] | None:
        name = moeslots_routing(routing)
        for r in ours:
            if (r["load"], r["threads"], r["routing"], r["slots"], r["policy"]) == (load, t, name, slots, pol):
                return r
        return None

    tg = next((r["test"] for r in llama if r["test"].startswith("tg")), "tg")
    pp = next((r["test"] for r in llama if r["test"].startswith("pp")), "pp")
    groups = list(dict.fromkeys((r["load"], r["threads"], r["routing"]) for r in llama))
    head = (["load", "threads", "routing", "slots (MiB)", f"llama.cpp {tg} no cache", f"llama.cpp {pp} no cache",
             f"llama.cpp {tg} cache", f"llama.cpp {pp} cache"] + [f"moeslots {p}" for p in policies])
    out = [f"Model: {m.get('shape', '?')} (`{Path(str(m.get('path', '?'))).name}`).",
           f"Hardware: {hw.get('nproc', '?')} CPU threads ({hw.get('cpu', '?')}); GPU: {hw.get('gpu', '?')}.",
           ""]
    lb = d.get("llama_bench") or {}
    if lb:
        out += [f"llama.cpp: build {lb.get('build_number', '?')} ({lb.get('build_commit', '?')}), backends "
                f"{lb.get('backends', '?')}.", ""]
    out += ["Tokens/s (higher is better). moeslots' cells: decode tokens/s (its ratio to llama.cpp's decode with "
            "its cache of the same size, moeslots / llama.cpp) and moeslots' hit rate.", "",
            "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    no_cache = False
    for load, t, routing in groups:
        for s, mib in sorted(cache_of.items()):
            ref, mark = lk(load, t, routing, mib, tg), ""
            if ref is None:
                ref, mark = lk(load, t, routing, 0, tg), "†"
            cells = [load, str(t), routing, f"{s} ({mib})", _fmt(lk(load, t, routing, 0, tg)),
                     _fmt(lk(load, t, routing, 0, pp)), _fmt(lk(load, t, routing, mib, tg)),
                     _fmt(lk(load, t, routing, mib, pp))]
            for p in policies:
                r = ok(load, t, routing, s, p)
                if r is None:
                    cells.append("–")
                    continue
                no_cache = no_cache or bool(mark and ref)
                ratio = f"{r['tok_s'] / ref:.2f}×{mark}" if ref else "–"
                cells.append(f"{_fmt(r['tok_s'])} ({ratio}, {100 * r['hit_rate']:.0f} %)")
            out.append("| " + " | ".join(cells) + " |")
    if no_cache:
        out += ["", "†: the ratio to llama.cpp without a cache: it ran without its expert cache (it needs a GPU "
                "backend and refuses a context with `--moe-cache-mib` > 0 without one)."]
    routings = list(dict.fromkeys(g[2] for g in groups))
    out += ["", "Routing: " + "; ".join(ROUTING_TEXT.get(r, f"{r}: both replay this trace (llama.cpp through "
                                                             "LLAMA_MOE_REPLAY, moeslots through --replay)")
                                        for r in routings) + "."]
    chosen = sorted({f"{r['load']}, {r['threads']} threads, {r['slots']} slots, {r['routing']}: {r['policy']} chose "
                     f"{r['chosen']}" for r in ours if r.get("chosen")})
    if chosen:
        out += ["", "moeslots auto / default chose:"] + [f"- {c}" for c in chosen]
    out += _defaults(ours, lk, cache_of) + _predicted(ours)
    out += ["", "Commands:", "", "```"] + list(d.get("commands", [])) + ["```"]
    if d.get("not_run"):
        out += ["", "Not run (stopped before them, or failed):", "", "```"] + list(d["not_run"]) + ["```"]
    return "\n".join(out) + "\n"


def _defaults(ours: list[dict[str, Any]], lk: Any, cache_of: dict[int, int]) -> list[str]:
    """What a new user gets: the "default" policy's decode against llama.cpp's cache and the best named policy
    measured in the same cell, among those taking turns with it (the bench's medians); and, where the bench measured
    it, the default after auto's self-check ("default, settled": what the app runs after its first replies). Static
    measured once before the turns ("static (--every 0)") is the same policy at another moment, so it is not "the
    best"; where it read faster, the line says by how much. Where the default ran the best row's own policy, the line
    says so: a gap between the two is then between readings of one policy, not a wrong pick. A last line counts
    the cells where the default chose the best row's policy and those within 5 % of its speed."""
    out = []
    picked = near = 0
    for r in (r for r in ours if r["policy"] == "default"):
        cell = [o for o in ours if (o["load"], o["threads"], o["routing"], o["slots"]) ==
                (r["load"], r["threads"], r["routing"], r["slots"])]
        named = [o for o in cell if not o["policy"].startswith("default") and o["policy"] != "static (--every 0)"]
        best = max(named or cell, key=lambda o: o["tok_s"])
        once = next((o for o in cell if o["policy"] == "static (--every 0)" and o["tok_s"] > best["tok_s"]), None)
        settled = next((o for o in cell if o["policy"] == "default, settled"), None)
        routing = "random" if r["routing"] == "uniform" else r["routing"]
        ref = lk(r["load"], r["threads"], routing, cache_of.get(r["slots"], -1), next(
            (t for t in ("tg64", "tg96", "tg128") if lk(r["load"], r["threads"], routing, 0, t)), "tg64"))
        same = _chosen_policy(r.get("chosen", "")) == best["policy"]
        picked += same
        near += r["tok_s"] >= 0.95 * best["tok_s"]
        out.append(f"- {r['load']}, {r['threads']} threads, {r['slots']} slots, {r['routing']}: default "
                   f"{_fmt(r['tok_s'])} tok/s = {r['tok_s'] / best['tok_s']:.2f} of the best ({best['policy']} "
                   f"{_fmt(best['tok_s'])}" + (", the policy the default ran" if same else "")
                   + (f"; static measured once before the turns {_fmt(once['tok_s'])}, the "
                      f"default {r['tok_s'] / once['tok_s']:.2f} of it" if once else "")
                   + ")" + (f", {r['tok_s'] / ref:.2f}x llama.cpp's cache" if ref else "")
                   + (f"; after its self-check {_fmt(settled['tok_s'])} tok/s = "
                      f"{settled['tok_s'] / best['tok_s']:.2f} of the best" if settled else ""))
    if not out:
        return []
    out.append(f"- the default chose the best row's policy in {picked} of {len(out)} cells; its speed was within 5 % "
               f"of the best in {near} of {len(out)}")
    return ["", "What a new user gets (no --policy, a fresh config: the first-run calibration, then auto):"] + out


def _chosen_policy(chosen: str) -> str:
    """The policy a default row's choice names ("fetch-split: 16 core + ...", "static (the default without a GPU)")."""
    return chosen.split(":", 1)[0].split(" (", 1)[0].strip()


def _predicted(ours: list[dict[str, Any]]) -> list[str]:
    rows = [r for r in ours if r.get("ms") and r.get("sim_ms")]
    if not rows:
        return []
    off = [r for r in rows if abs(r["sim_ms"] / r["ms"] - 1) > 0.10]
    out = ["", f"Predicted vs measured ms/token: {len(rows) - len(off)} of {len(rows)} rows within 10 %.", "",
           "| load | threads | routing | slots | policy | measured ms | predicted ms | error |", "|---" * 8 + "|"]
    for r in rows:
        e = r["sim_ms"] / r["ms"] - 1
        # a row off by more than 10 %: its readings, to tell a miss from a row that moved
        reps = r.get("rep_ms") or []
        seen = f" (readings {', '.join(f'{x:.2f}' for x in reps)})" if abs(e) > 0.10 and len(reps) > 1 else ""
        out.append(f"| {r['load']} | {r['threads']} | {r['routing']} | {r['slots']} | {r['policy']} | {r['ms']:.2f} | "
                   f"{r['sim_ms']:.2f} | {100 * e:+.1f} %{' !' if abs(e) > 0.10 else ''}{seen} |")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if len(args) == 2 and args[0] == "--json":
            sys.stdout.write(render(_load(Path(args[1]))))
            return 0
        if len(args) != 1 or args[0].startswith("-"):
            print("usage: table.py OUT_DIR | table.py --json sidebyside.json", file=sys.stderr)
            return 2
        out = Path(args[0])
        d = collect(out)
        (out / "sidebyside.json").write_text(json.dumps(d, indent=1))
        md = render(d)
        (out / "sidebyside.md").write_text(md)
        sys.stdout.write(md)
        return 0
    except (TableError, KeyError, TypeError) as e:
        print(f"table.py: {e if isinstance(e, TableError) else f'malformed results: {e!r}'}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
