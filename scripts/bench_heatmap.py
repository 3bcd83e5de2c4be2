"""Benchmark (not a test): one heatmap frame for 64 layers x 256 slots — new data for every layer, every row's
Strip rebuilt and rendered. Prints the median over 30 frames. Usage: python scripts/bench_heatmap.py"""

from __future__ import annotations

import asyncio
import statistics
import time

import numpy as np
from textual.app import App, ComposeResult

from moeslots.tui.widgets.heatmap import SlotHeatmap

L, S = 64, 256


class Host(App[None]):
    def compose(self) -> ComposeResult:
        yield SlotHeatmap()


async def main() -> None:
    rng = np.random.default_rng(0)
    app = Host()
    async with app.run_test(size=(S * 2 + 20, L + 2)) as pilot:
        hm = app.query_one(SlotHeatmap)
        await pilot.pause()
        times = []
        for _ in range(30):
            rows = [(il, tuple(range(S)), tuple(int(x) for x in rng.integers(0, 50, S)), float(rng.random()))
                    for il in range(L)]
            t0 = time.perf_counter()
            hm.update_layers(rows)
            for y in range(L):                     # what a full repaint asks of the widget
                hm.render_line(y)
            times.append(time.perf_counter() - t0)
        print(f"heatmap frame {L} layers x {S} slots: median {1000 * statistics.median(times):.2f} ms, "
              f"p90 {1000 * float(np.percentile(times, 90)):.2f} ms")


asyncio.run(main())
