"""Native objects left open at interpreter exit are closed by engine.model's atexit hook, in dependency order, while
the interpreter is whole (on the H200 box, a model with slots left to shutdown garbage collection segfaulted at
exit: its expert cache was freed by a C++ static destructor after the CUDA runtime; the other half: patch 0002 never
destroys the cache registry).
Each case runs in its own process; a probe registered before moeslots is imported runs after its hook (atexit is
last in, first out) and reports what is still open."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

PROBE = """
import atexit, sys
SEEN = []
def probe():
    print("open at exit:", [type(o).__name__ for o in SEEN if getattr(o, "ptr", None)], flush=True)
atexit.register(probe)          # registered first: runs after moeslots' hook
"""


def _run(body: str, model: Path) -> subprocess.CompletedProcess:
    code = PROBE + f"MODEL = {str(model)!r}\n" + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_open_model_context_and_mtp_with_slots_are_closed_at_exit(tiny_glm: Path) -> None:
    r = _run("""
        from moeslots.engine.native.expert_cache import SlotPlan
        from moeslots.engine.llm.model import Context, LoadOptions, Model
        from moeslots.engine.llm.mtp import MTP
        m = Model(MODEL, LoadOptions(extra_bufts=False, load_mtp=True))
        m.set_slots(SlotPlan({il: (0, 1, 2) for il in m.facts.moe_layers}), pack_host=True)
        ctx = Context(m, n_ctx=128, threads=2)
        mtp = MTP(m, ctx, n_draft=1, threads=2)
        ctx.decode([5, 6, 7]); ctx.decode([8])
        SEEN += [mtp, ctx, m]
        print("decoded", flush=True)
    """, tiny_glm)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "decoded" in r.stdout
    assert "open at exit: []" in r.stdout, r.stdout


def test_an_engine_generating_on_another_thread_is_left_open_not_freed_under_it(tiny_glm: Path) -> None:
    r = _run("""
        import threading
        from moeslots.engine.runtime.engine import Engine, EngineConfig
        e = Engine(EngineConfig(model=MODEL, n_ctx=256, threads=2, pack_host=True, slots=0))
        e.state.busy.acquire()                       # a reply in progress on some other thread
        SEEN += [e.ctx, e.model]
        print("busy", flush=True)
    """, tiny_glm)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "open at exit: ['Context', 'Model']" in r.stdout, r.stdout


def test_an_idle_engine_is_closed_at_exit(tiny_glm: Path) -> None:
    r = _run("""
        from moeslots.engine.runtime.engine import Engine, EngineConfig
        e = Engine(EngineConfig(model=MODEL, n_ctx=256, threads=2, pack_host=True, slots=0))
        SEEN += [e.ctx, e.model] + ([e.mtp] if e.mtp else [])
        print("idle", flush=True)
    """, tiny_glm)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "open at exit: []" in r.stdout, r.stdout
