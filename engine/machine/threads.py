"""How many llama.cpp threads: inside the app, one physical core is left to the UI.

llama.cpp's CPU threads wait for each other at every op of the graph by spinning. When they occupy every core, any
moment the UI thread runs (a redraw, a timer, a toast) takes a core from one of them and the others spin until
it is back: on a 2-core machine two threads ran the bundled model at 1,100 tok/s alone and at 80 tok/s under the
app once a notification was on screen; one thread ran it at 950 tok/s alone and 850 under the app. Hyper-threads
share a core's arithmetic, so the count starts from physical cores, as llama.cpp's own tools do. (A second way
threads stall each other, two OpenMP teams over the CPUs, is kept out by engine.runtime.passing_thread.)
"""

from __future__ import annotations

import os
from pathlib import Path

SYS_CPU = Path("/sys/devices/system/cpu")
UI_CORES = 1                     # physical cores the app keeps for its UI thread (and the rest of the process)


def allowed_cpus() -> list[int]:
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def physical_cores(cpus: list[int] | None = None, root: Path = SYS_CPU) -> int:
    """Distinct (package, core) pairs among the CPUs this process may run on; the CPU count where the topology
    cannot be read."""
    cpus = allowed_cpus() if cpus is None else cpus
    seen = set()
    for c in cpus:
        topo = root / f"cpu{c}" / "topology"
        try:
            seen.add(((topo / "physical_package_id").read_text().strip(), (topo / "core_id").read_text().strip()))
        except OSError:
            return max(1, len(cpus))
    return max(1, len(seen))


def app_threads(cpus: list[int] | None = None, root: Path = SYS_CPU) -> int:
    """The app's default llama.cpp threads: physical cores minus UI_CORES, at least one."""
    return max(1, physical_cores(cpus, root) - UI_CORES)
