"""The cut of a layer pipeline inside one cluster: devices per stage, the allocation, and its predicted step time.

Every rank's measurements (`nebula.hybrid.probe` for links, memory and the step's closing all-reduce;
`nebula.hybrid.costs.time_layers` for each layer's forward, backward and optimizer seconds on that rank) become one
`DeviceProfile` per rank and one per stage (the slowest, smallest, worst-linked of its replicas, which run in
lock-step), the allocator cuts the layers, and the schedule model (`nebula.hybrid.schedule`) predicts the step from
the per-layer times each stage's own ranks measured.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Sequence

from nebula.hybrid.layered import check_bounds
from nebula.hybrid.schedule import StageCost, allreduce_s, gpipe_step_s, link_s
from nebula.hybrid.topology import Layout

__all__ = ["HybridPlan", "rank_devices", "stage_devices", "stage_costs", "plan_bounds", "MESSAGES_PER_MICRO_BATCH"]

MESSAGES_PER_MICRO_BATCH = 3  # shape header and activation forward, gradient back


@dataclass(slots=True)
class HybridPlan:
    """The layout and cut a run uses (logged, written into checkpoints and metrics) and what it was made from."""

    layout: Layout
    bounds: list[int]
    method: str  # "bounds" when given explicitly
    probes: list = field(default_factory=list)  # RankProbe per rank when the benchmark ran
    predicted_stage_s: list[float] = field(default_factory=list)  # the allocator's stage times (per micro-batch)
    predicted_step_s: float | None = None  # the schedule model's step time on the ranks' own layer timings
    costs: list = field(default_factory=list)  # LayerCost per layer
    devices: list = field(default_factory=list)  # DeviceProfile per rank, named rank<r>
    stage_costs: list = field(default_factory=list)  # StageCost per stage the prediction used
    cores: float = math.inf  # CPU cores one pipeline's stages share in the prediction

    def record(self) -> dict:
        """Plain values for the plan file and checkpoint markers (enough to re-allocate from)."""
        return {"bounds": self.bounds, "method": self.method, "num_stages": self.layout.num_stages,
                "num_replicas": self.layout.num_replicas, "predicted_stage_s": self.predicted_stage_s,
                "predicted_step_s": self.predicted_step_s, "cores": self.cores,
                "costs": [dataclasses.asdict(c) for c in self.costs],
                "devices": [dataclasses.asdict(d) for d in self.devices],
                "stage_costs": [dataclasses.asdict(c) for c in self.stage_costs]}


def rank_devices(probes: Sequence[Any], time_per_flop_s: Sequence[float] | None = None) -> list:
    """One DeviceProfile per rank (`rank<r>`): its measured speed (`time_per_flop_s` from its own layer timings
    when given, else the probe's), free memory and link to the next rank."""
    from nebula.balance import DeviceProfile

    return [DeviceProfile(time_per_flop_s[r] if time_per_flop_s is not None else p.time_per_flop_s,
                          p.free_memory_bytes, p.latency_s, p.bandwidth_bytes_per_s, f"rank{r}")
            for r, p in enumerate(probes)]


def stage_devices(devices: Sequence[Any], layout: Layout) -> list:
    """One DeviceProfile per stage from per-rank ones: the slowest, smallest, worst-linked of its replicas."""
    from nebula.balance import DeviceProfile

    out = []
    for s in range(layout.num_stages):
        ds = [devices[r] for r in layout.stage_ranks(s)]
        # a boundary carries MESSAGES_PER_MICRO_BATCH messages per micro-batch (header, activation, gradient)
        out.append(DeviceProfile(max(d.time_per_flop_s for d in ds), min(d.memory_bytes for d in ds),
                                 MESSAGES_PER_MICRO_BATCH * max(d.latency_s for d in ds),
                                 min(d.bandwidth_bytes_per_s for d in ds), f"stage{s}"))
    return out


def stage_costs(layout: Layout, bounds: Sequence[int], timings: Sequence[Sequence[Any]],
                probes: Sequence[Any], slowdown: Sequence[float] = ()) -> list[StageCost]:
    """Per-stage seconds for the schedule model, from the layer timings of each stage's own ranks (the slowest
    replica) and the probed links: header + activation forward, gradient back, ring all-reduce of the gradients;
    `slowdown` per rank (simulated: that part of a rank's compute time sleeps)."""
    out = []
    for s in range(layout.num_stages):
        ranks = layout.stage_ranks(s)
        a, b = bounds[s], bounds[s + 1]

        def worst(attr: str) -> float:
            return max(sum(getattr(timings[r][j], attr) for j in range(a, b)) for r in ranks)

        lat = max(probes[r].latency_s for r in ranks)
        bw = min(probes[r].bandwidth_bytes_per_s for r in ranks)
        grads = sum(timings[ranks[0]][j].param_bytes for j in range(a, b))
        act = timings[ranks[0]][b - 1].output_bytes if s < layout.num_stages - 1 else 0
        last = s == layout.num_stages - 1
        out.append(StageCost(worst("forward_s"), worst("backward_s"),
                             worst("optimizer_s") + allreduce_s(grads, len(ranks), lat, bw),
                             0.0 if last else link_s(act, lat, bw, messages=2),
                             0.0 if last else link_s(act, lat, bw),
                             1.0 / max(slowdown[r] for r in ranks) if slowdown else 1.0))
    return out


def plan_bounds(num_layers: int, layout: Layout, pp: Any, *, probes: Sequence[Any] = (), costs: Sequence[Any] = (),
                time_per_flop_s: Sequence[float] | None = None, timings: Sequence[Sequence[Any]] = (),
                micro_batches: int = 1, cores: float = math.inf) -> HybridPlan:
    """The cut for `layout`: explicit `pp.bounds`, else `pp.allocation` over the measured ranks; with `timings`
    (every rank's `time_layers`) the predicted step time of the runner's schedule, its stages sharing `cores`."""
    devices = rank_devices(probes, time_per_flop_s) if probes else []
    if pp.bounds is not None and len(pp.bounds) == layout.num_stages + 1:
        plan = HybridPlan(layout, check_bounds(pp.bounds, num_layers, layout.num_stages), "bounds", list(probes),
                          costs=list(costs), devices=devices)
    else:
        if num_layers < layout.num_stages:
            raise ValueError(f"{num_layers} layers cannot fill {layout.num_stages} pipeline stages; use at most "
                             f"{num_layers} stages")
        from nebula.balance import allocate

        alloc = allocate(costs, stage_devices(devices, layout), pp.allocation)
        plan = HybridPlan(layout, check_bounds(alloc.bounds, num_layers, layout.num_stages), pp.allocation,
                          list(probes), [float(t) for t in alloc.stage_times_s], costs=list(costs), devices=devices)
    if timings and probes:
        sync = max(p.allreduce_s for p in probes)
        plan.stage_costs = stage_costs(layout, plan.bounds, timings, probes, pp.slowdown)
        plan.predicted_step_s = gpipe_step_s(plan.stage_costs, micro_batches, sync, cores)
        plan.cores = cores
    return plan
