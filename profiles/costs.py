"""The cost model of a decode token, shared by the simulator, `--repick auto`, the slots line and the benchmarks.

Per decode token (sequential, no overlap): base (non-expert work) + picks served from VRAM x slab / GPU GB/s + picks
computed in host memory x slab / CPU GB/s + slabs uploaded x slab / PCIe GB/s. A machine's own rates come from
`moeslots doctor --calibrate` (engine.calibrate); without one, every user of costs takes the defaults here, measured
on a 16-core machine with one PCIe 5 H200: CPU 63 GB/s (16 threads: the scheduler clock's compute time per
expert), GPU ~4000 GB/s, a 3.06 MB slab (Qwen3-30B-A3B shape at Q4_K_M), base 8.8 ms = the GPU's 4.6 ms at full
residency + 48 partly resident layers x 87 us, the CPU round trip each such layer pays every token (base is what a
token costs with slots in every layer, apart from its experts: what `doctor --calibrate` measures, from 0 and S
slots), and the uploads two calibrations measured there (25.6-26.8 GB/s from pinned memory, 5.3-6.7 GB/s from
pageable (mmap) memory; the lower of each, so an uncalibrated guess errs static). A tier stepped on the GPU
(`--policy fetch`) pays no round trip (base less 48 x split_ms), copies at the GPU's own reading rate of pinned
memory (50 GB/s there) and ~15 us per layer for its rule and launches (the measured minus the simulated ms/token
under uniform routing). With a CPU share
(`--policy fetch-split`) each layer adds share_ms: the CPU's wait for the inputs the GPU publishes and the join after
the two halves (an estimate until the GPU measures it; `doctor --calibrate` does, as the difference between a
fetch-split decode that leaves nothing to the CPU and a fetch decode).

Two costs of the GPU-stepped tier are best measured rather than derived, and a calibration that measured them
(engine.fetch_rates, run by itself on first use: engine.autocal) sets them: fetch_base_ms, the token's cost with
the tier stepped on the GPU apart from its copies (the intercept of two decodes with different copies per token;
derived as base less the round trips plus fetch_layer_ms a layer only when not measured: that derivation came out
30-45 % slow), and share_cpu_gbps, the rate the CPU computes a fetch-split share at while the GPU
reads host memory beside it, and share_overlap_ms, the GPU's own work in a layer (its slot chain after the fetch
node publishes the share) that the share runs beside as well as the copies: a layer costs the larger of copies plus
that work and the CPU part, less that work (it is in fetch_base_ms), plus share_ms (profiles.split.fetch_layers_ms).
Either is fitted to fetch-split decodes whose split the simulator reproduces (profiles.sharefit): fitted on the
token's sums, ignoring that each layer pays the larger of its two parts, the model predicted its own calibration
5 % slow and the H100 box's fetch-split rows 2-14 % slow, most at high hit rates; fitted per layer (the CPU at its
own rate), the GPU's work beside the share came out 34 us a layer at 16 threads (22-45 from one decode alone), at
6 threads within the decodes' noise (not fitted), and the same rows within -3 to +6 %
(tests/engine/test_share_recorded.py). The engine splits a fetch-split tier's misses by the two rates (not by the
overlap).

Uploads from pageable memory (an mmap'ed model) do not overlap the CPU's experts: an asynchronous copy from pageable
memory returns only once the driver has staged it through its own pinned buffer, and the host tier's step (patch
0007) queues its copies before the layer's CPU half starts, so a layer costs its uploads plus its CPU part
(serial_uploads), and the host tier's split minimises that sum (profiles.hybrid.rule_costs). Measured on the H100
box (30B-A3B shape, mmap, 6 threads, uniform routing, 8 tier slots of 32, the overlapped split): hybrid 44.7
ms/token, against 49.4 summed and 32.1 overlapped; from pinned memory the same rows run as overlapped (21.0 ms
against 20.7). A tier whose pack is in host memory copies synchronously too; its costs come from no GPU
calibration and keep the overlapped model.

A host tier also costs every layer it moves in (each step) its route node: after the router the CPU scores the
picks, splits the misses and writes the ids both chains read, so the slot chain waits for a host round trip that
static's does not (route_ms, measured by engine.route_cost as the host tier that moves nothing against static;
0 where not measured). On the H100 box's third run the host tier's rows ran 0.3-2.1 ms a token slower than predicted
beyond static's own error in 7 of 8 cells: about 20 us a layer, not yet measured directly.
"""

from __future__ import annotations

import dataclasses

H200_UPLOAD_GBPS = {"pinned": 25.6, "pageable": 5.3}


@dataclasses.dataclass(frozen=True)
class CostModel:
    slab_mb: float = 3.06
    cpu_gbps: float = 63.0
    pcie_gbps: float = H200_UPLOAD_GBPS["pinned"]
    gpu_gbps: float = 4000.0
    base_ms: float = 8.8
    split_ms: float = 0.087         # per partly resident layer: the CPU round trip inside base_ms
    fetch_gbps: float = 50.0        # a GPU-stepped tier's uploads: the GPU reading pinned host memory itself
    fetch_layer_ms: float = 0.015   # per layer and step: what a GPU-stepped tier costs beyond its copies
    share_ms: float = 0.040         # per layer and step, a GPU-stepped tier with a CPU share: its wait and join
    fetch_base_ms: float = 0.0      # per token, a GPU-stepped tier apart from its copies (0: not measured, derived)
    share_cpu_gbps: float = 0.0     # the CPU's rate on a fetch-split share (0: not measured, cpu_gbps)
    share_overlap_ms: float = 0.0   # per layer, the GPU's own work a fetch-split share runs beside (0: none)
    serial_uploads: bool = False    # a host tier's uploads add to the CPU's work (pageable memory), not overlap it
    route_ms: float = 0.0           # per layer with a host tier and step: its route node's round trip (0: none)

    def ms_per_token(self, gpu_picks: float, cpu_picks: float, uploads: float) -> float:
        mb = self.slab_mb
        return (self.base_ms + gpu_picks * mb / self.gpu_gbps + cpu_picks * mb / self.cpu_gbps
                + uploads * mb / self.pcie_gbps)

    def fetch_step_ms(self, layers: int, n_tokens: int = 1) -> float:
        """A GPU-stepped tier's step of n_tokens over `layers` layers apart from its copies and CPU share."""
        if self.fetch_base_ms > 0:
            return n_tokens * self.fetch_base_ms
        return n_tokens * max(0.0, self.base_ms - layers * self.split_ms) + layers * self.fetch_layer_ms

    @property
    def share_cpu(self) -> float:
        """GB/s of the CPU on a fetch-split share."""
        return self.share_cpu_gbps or self.cpu_gbps

    @classmethod
    def h200(cls, slab_mb: float | None = None, *, pinned: bool = True) -> "CostModel":
        """The default costs (measured on a PCIe 5 H200 machine) for a model of `slab_mb` per expert, uploads from
        pinned or pageable memory."""
        return cls(slab_mb=slab_mb or cls.slab_mb, pcie_gbps=H200_UPLOAD_GBPS["pinned" if pinned else "pageable"],
                   serial_uploads=not pinned)
