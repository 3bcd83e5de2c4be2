"""Work that may compute on the CPU, run in a thread that ends with it, so no thread that outlives it has computed.

The engine's CPU backend runs each graph as an OpenMP team of the thread that computes it, and libgomp keeps that
team, parked, for as long as the thread lives. Once the threads libgomp manages outnumber the CPUs, every wait of
every team spins 100 rounds and then sleeps in the kernel, at every op of every graph. So two threads that have both
computed with T threads, on a machine with fewer than about 2T CPUs, slow each other down for good: on a 2-core
machine at 2 threads, one-token decodes of the bundled model in a thread took 0.30 ms alone and 3.4-6.0 ms once the
calling thread had decoded a prompt; on the GPU box (16 CPUs) a share worker's team of 16 beside the decoding
thread's computed 1.7-1.9x slower than without OpenMP (docs/lab/2026-12-07-worker-openmp.md). Long-lived threads
that compute are the hazard: the main thread that opens a model (the first-run calibration decodes), and the
threads of Textual's worker pool, which are kept and reused. So opening a model, each reply and each slot change
run here, each in a thread that ends with it.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Callable, TypeVar

T = TypeVar("T")


def run(fn: Callable[[], T], name: str = "moeslots-open") -> T:
    """fn() in a new thread that ends when fn returns; its result, or its exception raised here. The caller waits in
    short waits, so Ctrl-C (or a signal made one) reaches it; fn then gets a KeyboardInterrupt too, where it would have
    on the calling thread (after the library call in progress), cleans up as it would there, and the caller raises
    its own once fn's thread has ended: nothing is left loading while the process exits."""
    box: dict[str, object] = {}
    done = threading.Event()                # (not join(): an interrupted join can leave the thread looking ended)

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:          # noqa: BLE001 - handed to the caller, whatever it is
            box["error"] = e
        finally:
            done.set()

    def ended() -> bool:                    # (an interrupt that lands in target's finally: the thread ends unset)
        return done.wait(0.1) or not t.is_alive()

    t = threading.Thread(target=target, name=name, daemon=True)
    try:
        t.start()
        while not ended():
            pass
    except KeyboardInterrupt:
        if t.ident is not None and not done.is_set() and t.is_alive():
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(t.ident), ctypes.py_object(KeyboardInterrupt))
        while t.ident is not None:          # the work is stopping: a second Ctrl-C does not leave it running
            try:
                if ended():
                    t.join()
                    break
            except KeyboardInterrupt:
                continue
        value = box.get("value")            # finished before the interrupt reached it: not handed to anyone
        if value is not None and callable(getattr(value, "close", None)):
            value.close()  # type: ignore[attr-defined]
        raise
    t.join()                                # ended, its thread team with it, before the caller goes on
    if "error" in box:
        raise box["error"]                  # type: ignore[misc]
    return box["value"]                     # type: ignore[return-value]
