"""Re-allocation when ranks leave or join: relaunch the cluster on a new layout that resumes from the last step.

When a rank dies, paddle.distributed.launch stops the cluster's other ranks and exits with an error. The elastic
launcher then derives the job for the ranks that remain: the ranks that left are the first whose processes were
seen gone (`nebula.launch.departures`; the last rank if none was seen, e.g. a launcher that failed before its
ranks started), and the survivors keep their order, their profiles and their simulated slowdowns. The layout keeps
its stage count if the survivors still form equal replicas of it, else becomes one pipeline over all of them
(`shrink_layout`). The new cut comes from `nebula.balance.reallocate`: the old partition and the ranks' measured
profiles (written into every checkpoint marker by the runner) give the old stages; the survivors, grouped into the
new stages, are the new devices, and each new stage already holds the layer ranges its ranks held. Among the cuts
with the method's best bottleneck it keeps the one that moves the fewest layer bytes; the relaunched ranks run that
cut as explicit bounds (no new benchmark) and load their layers from the per-layer checkpoint
(nebula.hybrid.checkpoint), so training continues from the newest committed step. A run that measured nothing
(explicit bounds, no probe) is re-allocated on the layers' analytic costs over identical devices.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import yaml

from nebula.config.schema import to_dict
from nebula.config.job import JobConfig, load_job_config
from nebula.hybrid import checkpoint as ckpt
from nebula.hybrid.topology import Layout, shrink_layout
from nebula.pipeline.checkpoint import read_step_marker

__all__ = ["relayout", "write_job", "launch_elastic", "ElasticPlan", "reallocate_layout"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ElasticPlan:
    """The layout and cut for the ranks that remain, and the re-allocation that chose the cut."""

    layout: Layout
    bounds: list[int]
    moved_bytes: float
    total_bytes: float
    seconds: float  # time the re-allocation took
    realloc: Any  # nebula.balance.Reallocation

    def record(self, old: Layout, old_bounds: Sequence[int], costs: Sequence[Any], devices: Sequence[Any],
               survivors: Sequence[int]) -> dict:
        """What was re-allocated from what (JSON), for people and tests."""
        return {"old_layout": [old.num_stages, old.num_replicas], "old_bounds": list(old_bounds),
                "survivors": list(survivors),
                "layout": [self.layout.num_stages, self.layout.num_replicas], "bounds": self.bounds,
                "method": self.realloc.allocation.method, "moved_bytes": self.moved_bytes,
                "total_bytes": self.total_bytes, "seconds": self.seconds,
                "costs": [dataclasses.asdict(c) for c in costs], "devices": [dataclasses.asdict(d) for d in devices]}


def reallocate_layout(old: Layout, old_bounds: Sequence[int], costs: Sequence[Any], devices: Sequence[Any],
                      world_size: int, method: str, survivors: Sequence[int] | None = None) -> ElasticPlan:
    """Re-allocate `costs` from `old` (cut at `old_bounds`, ranks profiled as `devices`, rank order) onto
    `world_size` ranks, the old ranks `survivors` (by default the first ones) in that order: the new layout, the cut
    `reallocate` chose, and the layer bytes it moves."""
    from nebula.balance import evaluate, reallocate
    from nebula.hybrid.cut import stage_devices

    start = time.perf_counter()
    survivors = list(range(world_size) if survivors is None else survivors)
    if len(set(survivors)) != len(survivors) or len(survivors) != world_size \
            or not set(survivors) <= set(range(len(devices))):
        raise ValueError(f"survivors {survivors} are not {world_size} distinct ranks of the {len(devices)} there were")
    new = shrink_layout(old, world_size, len(costs))
    previous = evaluate(method, old_bounds, costs,
                        [dataclasses.replace(d, name=f"old-{d.name}") for d in stage_devices(devices, old)])
    now = stage_devices([devices[r] for r in survivors], new)
    # each new stage holds, once per rank of it, the range that rank's old stage had (new rank r was old survivors[r])
    held = {now[s].name: [(old_bounds[old.stage_of(survivors[r])], old_bounds[old.stage_of(survivors[r]) + 1])
                          for r in new.stage_ranks(s)] for s in range(new.num_stages)}
    r = reallocate(previous, costs, now, method, held=held)
    seconds = time.perf_counter() - start
    total = sum(c.memory_bytes for c in costs) * new.num_replicas
    return ElasticPlan(new, list(r.allocation.bounds), r.moved_bytes, total, seconds, r)


def _measured(record: dict, cfg: JobConfig, cluster: str, world: int) -> tuple[list, list]:
    """(layer costs, per-rank device profiles) the old run measured, or analytic costs on identical devices."""
    from nebula.balance import DeviceProfile, LayerCost

    if record.get("costs") and len(record.get("devices") or ()) == world:
        return [LayerCost(**c) for c in record["costs"]], [DeviceProfile(**d) for d in record["devices"]]
    from nebula.hybrid.costs import analytic_layer_costs
    from nebula.hybrid.layered import layered_model
    from nebula.pipeline.stage import load_recipe

    t = cfg.train
    batch = t.global_batch // (int(record["num_replicas"]) * t.micro_batches)
    costs = analytic_layer_costs(layered_model(load_recipe(cfg.recipe)), batch, micro_batches=t.micro_batches)
    return costs, [DeviceProfile(1e-12, math.inf, name=f"rank{r}") for r in range(world)]


def relayout(cfg: JobConfig, cluster: str, world_size: int, num_layers: int,
             bounds: Sequence[int] | None = None, survivors: Sequence[int] | None = None) -> JobConfig:
    """`cfg` with `cluster` running `world_size` ranks on one node, its pipeline re-laid out for them (cut at
    `bounds` when given; else an old cut that still fits, or none so that the ranks allocate afresh); the new ranks
    are the old ranks `survivors` (by default the first ones) and keep their simulated slowdowns."""
    spec = cfg.cluster(cluster)
    pp = spec.pipeline
    if pp is None:
        raise ValueError(f"cluster {cluster} has no pipeline section: only layer pipelines re-allocate layers")
    old = Layout(pp.num_stages, max(spec.world_size // pp.num_stages, 1))
    new = shrink_layout(old, world_size, num_layers)
    if bounds is None:
        bounds = pp.bounds if pp.bounds is not None and len(pp.bounds) == new.num_stages + 1 else None
    survivors = list(range(world_size) if survivors is None else survivors)
    slowdown = tuple(pp.slowdown[r] if r < len(pp.slowdown) else 1.0 for r in survivors) if pp.slowdown else ()
    pp = dataclasses.replace(pp, num_stages=new.num_stages, bounds=tuple(bounds) if bounds is not None else None,
                             slowdown=slowdown)
    spec = dataclasses.replace(spec, nodes=1, procs_per_node=world_size, pipeline=pp)
    clusters = tuple(spec if c.id == cluster else c for c in cfg.clusters)
    return dataclasses.replace(cfg, clusters=clusters)


def write_job(cfg: JobConfig, path: str | Path) -> Path:
    """Write `cfg` as a job file (paths in it are already absolute)."""
    path = Path(path)
    path.write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    return path


def launch_elastic(job_file: str | Path, cluster: str, *, min_ranks: int = 1,
                   launch: Callable[..., int] | None = None) -> int:
    """Run `cluster`'s part of the job; each time the launcher fails after a committed checkpoint, relaunch without
    the ranks that left (down to `min_ranks`) on the cut `reallocate` chooses, so the job continues on the new
    layout. Returns the last exit code."""
    from nebula.hybrid.layered import layered_model
    from nebula.launch.departures import DepartureWatch
    from nebula.launch.launcher import log_dir_of
    from nebula.launch.quiet import STOPPED_CODES
    from nebula.pipeline.stage import load_recipe

    if launch is None:
        from nebula.launch import launch as launch_cluster

        launch = launch_cluster
    job_file = Path(job_file).resolve()
    cfg = load_job_config(job_file)
    num_layers = layered_model(load_recipe(cfg.recipe)).num_layers
    ranks = cfg.cluster(cluster).world_size
    current = job_file
    measured: tuple[list, list] | None = None  # costs and rank profiles, kept across relaunches
    while True:
        with DepartureWatch(log_dir_of(cfg, cluster) / "ranks") as watch:
            code = launch(current, cluster)
        if code == 0 or code in STOPPED_CODES:  # finished, or stopped by the operator: nothing to relaunch
            return code
        gone = [r for r in watch.departed if r < ranks]
        if not gone:
            log.warning("cluster %s: no rank was seen leaving; taking the last, rank %d, as gone", cluster, ranks - 1)
            gone = [ranks - 1]
        survivors = [r for r in range(ranks) if r not in gone]
        steps = ckpt.committed_steps(cfg.checkpoint.dir, cluster, num_layers)
        if not steps or len(survivors) < min_ranks:
            log.error("cluster %s failed (exit %d) with %d rank(s) and %s; not relaunching", cluster, code, ranks,
                      f"checkpoint step {steps[-1]}" if steps else "no committed checkpoint")
            return code
        record = read_step_marker(cfg.checkpoint.dir, steps[-1], cluster)
        if measured is None:
            measured = _measured(record, cfg, cluster, ranks)
        costs, devices = measured
        old = Layout(int(record["num_stages"]), int(record["num_replicas"]))
        ranks = len(survivors)
        plan = reallocate_layout(old, record["bounds"], costs, devices, ranks,
                                 cfg.cluster(cluster).pipeline.allocation, survivors)
        cfg = relayout(cfg, cluster, ranks, num_layers, plan.bounds, survivors)
        current = write_job(cfg, job_file.with_name(f"{job_file.stem}.ranks{ranks}{job_file.suffix}"))
        current.with_suffix(".realloc.json").write_text(
            json.dumps(plan.record(old, record["bounds"], costs, devices, survivors), indent=1))
        measured = (costs, [devices[r] for r in survivors])
        log.warning("cluster %s lost rank(s) %s (exit %d): relaunching %d rank(s) as %d stage(s) x %d replica(s) "
                    "from checkpoint step %d (%s)", cluster, ",".join(map(str, gone)), code, ranks,
                    plan.layout.num_stages, plan.layout.num_replicas, steps[-1], current)
        log.warning("cluster %s: reallocate (%s) cut %s -> %s in %.3f s, moving %.0f of %.0f layer bytes (%.1f%%)",
                    cluster, plan.realloc.allocation.method, list(record["bounds"]), plan.bounds, plan.seconds,
                    plan.moved_bytes, plan.total_bytes, 100 * plan.moved_bytes / plan.total_bytes)
