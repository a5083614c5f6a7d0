"""Preflight of a job with `allocation:`: cut the recipe's layers between the clusters from their profiles.

Every cluster runs this step on its own from the same files (job, profiles written by `nebula bench`), so it
must give the same cut everywhere: layer costs are analytic (`analytic_layer_costs`: FLOPs and bytes from the
layers' shapes), never timed. Each cluster is one device in stage order: seconds per FLOP and memory from its
profile, and the WAN link to the next cluster as its latency and bandwidth (the last cluster sends nothing on).
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any

from nebula.config.schema import ConfigError
from nebula.config.job import JobConfig

__all__ = ["cluster_devices", "plan_clusters", "resolve_allocation"]

log = logging.getLogger(__name__)


def cluster_devices(cfg: JobConfig) -> list:
    """One DeviceProfile per cluster taking part, in stage order, with the WAN link to the next cluster."""
    from nebula.balance import DeviceProfile
    from nebula.hybrid.bench import read_profiles

    al = cfg.allocation_spec
    segs = [c for c, _ in cfg.segments]
    out = []
    for i, cid in enumerate(segs):
        path = al.profiles.get(cid)
        try:
            doc = read_profiles(path)
        except ValueError as exc:
            raise ConfigError(f"allocation: cluster {cid}: {exc} (nebula bench job.yaml --cluster {cid} --out "
                              f"{path})") from exc
        if doc["cluster"] != cid:
            raise ConfigError(f"allocation.profiles[{cid}] = {path} holds the profiles of cluster "
                              f"{doc['cluster']!r}; point it at {cid}'s file")
        p = doc["profile"]
        last = i == len(segs) - 1
        out.append(DeviceProfile(float(p["time_per_flop_s"]), float(p["memory_bytes"]),
                                 0.0 if last else al.wan.latency_ms / 1e3,
                                 float("inf") if last else al.wan.rate_mbit * 1e6 / 8, cid))
    return out


def plan_clusters(cfg: JobConfig) -> Any:
    """The Allocation of the recipe's layers over the job's clusters (ConfigError when it cannot be made)."""
    from nebula.balance import AllocationError, allocate
    from nebula.hybrid.costs import analytic_layer_costs
    from nebula.hybrid.layered import layered_model
    from nebula.pipeline.stage import load_recipe

    al = cfg.allocation_spec
    segs = cfg.segments
    if any(len(names) != 1 for _, names in segs):
        raise ConfigError("allocation: cuts the model once per cluster; list exactly one stage per cluster under "
                          "stages (the recipe's stage names, in order)")
    try:
        model = layered_model(load_recipe(cfg.recipe))
    except ValueError as exc:
        raise ConfigError(f"allocation: {exc}") from exc
    world = min(cfg.cluster(c).world_size for c, _ in segs)
    t = cfg.train
    costs = analytic_layer_costs(model, t.global_batch // (world * t.micro_batches), micro_batches=t.micro_batches)
    try:
        return allocate(costs, cluster_devices(cfg), al.method)
    except (AllocationError, ValueError) as exc:
        raise ConfigError(f"allocation: {exc}") from exc


def resolve_allocation(cfg: JobConfig) -> JobConfig:
    """`cfg` with the recipe's `bounds` set from `plan_clusters` (unchanged when the job has no allocation)."""
    if cfg.allocation is None:
        return cfg
    al, segs = cfg.allocation_spec, [c for c, _ in cfg.segments]
    if al.bounds:
        if al.devices and list(al.devices) != segs:
            raise ConfigError(f"allocation.devices {list(al.devices)} are not the job's clusters in stage order "
                              f"{segs}; rerun nebula allocate --write-job with these clusters")
        if len(al.bounds) != len(segs) + 1:
            raise ConfigError(f"allocation.bounds={list(al.bounds)} cut the model into {len(al.bounds) - 1} stages "
                              f"but the job runs {len(segs)} clusters; drop bounds to compute them at launch")
        bounds = [int(b) for b in al.bounds]
        log.info("allocation %s: layers cut at %s between clusters %s (from the job file)", al.method, bounds, segs)
    else:
        alloc = plan_clusters(cfg)
        bounds = [int(b) for b in alloc.bounds]
        log.info("allocation %s: layers cut at %s between clusters %s (predicted stage times %s s)", al.method,
                 bounds, segs, [round(float(x), 6) for x in alloc.stage_times_s])
    recipe = dataclasses.replace(cfg.recipe, args={**cfg.recipe.args, "bounds": bounds})
    return dataclasses.replace(cfg, recipe=recipe)
