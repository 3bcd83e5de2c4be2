"""Which configuration of the bundled model crashes on CUDA, and why MTP greedy text differs from plain greedy
there. Each case runs in its own process (a CUDA fault kills the process); prints one line per case."""

from __future__ import annotations

import subprocess
import sys

CASES = {
    "gpu-all": "opts=LoadOptions(experts_on_host=False); plan=None",
    "host-0": "opts=LoadOptions(); plan=None",
    "host-16-trunk": "opts=LoadOptions(); plan=16",
    "host-64-trunk": "opts=LoadOptions(); plan=64",
    "host-16-mtpload": "opts=LoadOptions(load_mtp=True); plan=16",
    "host-16-with-nextn": "opts=LoadOptions(load_mtp=True); plan=(16, True)",
}

BODY = """
import sys, numpy as np
from moeslots.engine.machine import bundled
from moeslots.engine.native.expert_cache import SlotPlan
from moeslots.engine.llm.model import Context, LoadOptions, Model
{case}
m = Model(bundled.model(), opts)
f = m.facts
if plan is not None:
    s, nextn = (plan, False) if isinstance(plan, int) else plan
    layers = [il for il in f.moe_layers if nextn or il < f.n_layer]
    print("set_slots:", m.set_slots(SlotPlan({{il: tuple(range(s)) for il in layers}})), flush=True)
ctx = Context(m, n_ctx=256, threads=16)
ids = m.tokenize("<|user|>\\nWhat does `json.dumps` do?\\n<|assistant|>\\n", add_special=False, parse_special=True)
for b in (len(ids), 1, 2, 3, 4, 5, 8, 16, 40):
    toks = [(7 * i + 11) % 6000 + 10 for i in range(b)] if b != len(ids) else ids
    print(f"batch {{b}}", end=" ", flush=True)
    ctx.decode(toks, all_logits=True)
    assert np.isfinite(ctx.logits(-1)).all(), "non-finite logits"
print("ok", flush=True)
"""

MTP_GAP = """
import numpy as np
from moeslots.engine.machine import bundled
from moeslots.engine.llm.model import Context, LoadOptions, Model
from moeslots.engine.llm.mtp import MTP, greedy_tokens
m = Model(bundled.model(), LoadOptions(load_mtp=True))
ctx = Context(m, n_ctx=512, threads=16)
ids = m.tokenize("<|user|>\\nWhat does `json.dumps` do?\\n<|assistant|>\\n", add_special=False, parse_special=True)
ctx.decode(ids)
plain, gaps = [], []
for _ in range(128):
    lg = ctx.logits().copy(); top = np.sort(lg)[-2:]
    t = int(np.argmax(lg)); plain.append(t); gaps.append(float(top[1] - top[0])); ctx.decode([t])
mtp = MTP(m, ctx, n_draft=1, threads=16)
got = greedy_tokens(mtp, ids, 128, lambda t: False)
d = next((i for i, (a, b) in enumerate(zip(plain, got)) if a != b), None)
print("first divergence", d, "of", len(got), "top1-top2 gap there", None if d is None else gaps[d],
      "min gap before", min(gaps[:d]) if d else None, flush=True)
"""


SLOT_DISTANCE = """
import numpy as np
from moeslots.engine.machine import bundled
from moeslots.engine.native.expert_cache import SlotPlan
from moeslots.engine.llm.model import Context, LoadOptions, Model
m = Model(bundled.model(), LoadOptions())
f = m.facts
ctx = Context(m, n_ctx=512, threads=16)
ids = m.tokenize("def parse(text):\\n    \\"\\"\\"Parse text.\\"\\"\\"\\n", add_special=False)
ctx.decode(ids)
toks = []
for _ in range(96):
    toks.append(ctx.argmax()); ctx.decode([toks[-1]])
def run(s):
    m.set_slots(SlotPlan({il: tuple(range(s)) for il in f.moe_layers if il < f.n_layer} if s else {}))
    ctx.reset(); ctx.decode(ids); out = [ctx.logits().copy()]
    for t in toks:
        ctx.decode([t]); out.append(ctx.logits().copy())     # 1-token steps: the cache path
    return np.array(out)
ref = run(0)
def report(name, got):
    rel = np.abs(got - ref).max(1) / np.abs(ref).max(1)
    print(f"{name}: teacher-forced over {len(ref)} steps: max rel logit diff {rel.max():.2e}, "
          f"top-1 agreement {(got.argmax(1) == ref.argmax(1)).mean():.3f}", flush=True)
for s in (16, 32, 64):
    report(f"slots {s}", run(s))
# the yardstick: stock llama.cpp with every expert on the GPU vs stock with experts in host memory (0 slots)
ctx.close(); m.close()
m = Model(bundled.model(), LoadOptions(experts_on_host=False))
ctx = Context(m, n_ctx=512, threads=16)
report("stock all-GPU vs stock host experts", run(0))
"""


def main() -> int:
    env_note = "CUDA_LAUNCH_BLOCKING=1"
    for name, case in CASES.items():
        r = subprocess.run([sys.executable, "-P", "-c", BODY.format(case=case)], capture_output=True, text=True,
                           timeout=120, env={**__import__("os").environ, "CUDA_LAUNCH_BLOCKING": "1"})
        out = (r.stdout.strip().splitlines() or [""])
        err = [line for line in r.stderr.splitlines() if "error" in line.lower() or "assert" in line.lower()
               or "function" in line][:4]
        print(f"{name:20} rc {r.returncode:4}  {' | '.join(out)[-300:]}  {' | '.join(err)[:600]}", flush=True)
    r = subprocess.run([sys.executable, "-P", "-c", MTP_GAP], capture_output=True, text=True, timeout=120)
    print("mtp-vs-plain (0 slots):", r.stdout.strip()[-400:], "\n".join(r.stderr.splitlines()[-3:])[:400])
    r = subprocess.run([sys.executable, "-P", "-c", SLOT_DISTANCE], capture_output=True, text=True, timeout=120)
    print("slots vs 0 (trained model):", r.stdout.strip()[-600:], "\n".join(r.stderr.splitlines()[-3:])[:400])
    print("note:", env_note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
