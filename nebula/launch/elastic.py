"""Re-allocation when ranks leave or join: relaunch the cluster on a new layout that resumes from the last step.

When a rank dies, paddle.distributed.launch stops the cluster's other ranks and exits with an error. The elastic
launcher then derives the job for one rank fewer (`relayout`): the layout keeps its stage count if the remaining
ranks still form equal replicas of it, else becomes one pipeline over all of them; an explicit cut that no longer
fits is dropped so the ranks re-allocate the layers (device benchmark, then the pipeline's allocation method);
the departed rank's slowdown factor goes with it. Per-layer checkpoints (nebula.hybrid.checkpoint) load into any
layout, so training continues from the newest committed step. A join is the same relaunch with more ranks.
"""
from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Callable

import yaml

from nebula.config._schema import to_dict
from nebula.config.job import JobConfig, load_job_config
from nebula.hybrid import checkpoint as ckpt
from nebula.hybrid.topology import Layout, shrink_layout

__all__ = ["relayout", "write_job", "launch_elastic"]

log = logging.getLogger(__name__)


def relayout(cfg: JobConfig, cluster: str, world_size: int, num_layers: int) -> JobConfig:
    """`cfg` with `cluster` running `world_size` ranks on one node, its pipeline re-laid out for them."""
    spec = cfg.cluster(cluster)
    pp = spec.pipeline
    if pp is None:
        raise ValueError(f"cluster {cluster} has no pipeline section: only layer pipelines re-allocate layers")
    old = Layout(pp.num_stages, max(spec.world_size // pp.num_stages, 1))
    new = shrink_layout(old, world_size, num_layers)
    bounds = pp.bounds if pp.bounds is not None and len(pp.bounds) == new.num_stages + 1 else None
    slowdown = tuple(pp.slowdown[:world_size]) + (1.0,) * max(0, world_size - len(pp.slowdown)) \
        if pp.slowdown else ()
    pp = dataclasses.replace(pp, num_stages=new.num_stages, bounds=bounds, slowdown=slowdown)
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
    """Run `cluster`'s part of the job; each time the launcher fails after a committed checkpoint, relaunch with
    one rank fewer (down to `min_ranks`) so the job continues on the new layout. Returns the last exit code."""
    from nebula.hybrid.layered import layered_model
    from nebula.pipeline.stage import load_recipe

    if launch is None:
        from nebula.launch import launch as launch_cluster

        launch = launch_cluster
    job_file = Path(job_file).resolve()
    cfg = load_job_config(job_file)
    num_layers = layered_model(load_recipe(cfg.recipe)).num_layers
    ranks = cfg.cluster(cluster).world_size
    current = job_file
    while True:
        code = launch(current, cluster)
        if code == 0:
            return 0
        steps = ckpt.committed_steps(cfg.checkpoint.dir, cluster, num_layers)
        if not steps or ranks <= min_ranks:
            log.error("cluster %s failed (exit %d) with %d rank(s) and %s; not relaunching", cluster, code, ranks,
                      f"checkpoint step {steps[-1]}" if steps else "no committed checkpoint")
            return code
        ranks -= 1
        cfg = relayout(cfg, cluster, ranks, num_layers)
        current = write_job(cfg, job_file.with_name(f"{job_file.stem}.ranks{ranks}{job_file.suffix}"))
        pp = cfg.cluster(cluster).pipeline
        log.warning("cluster %s lost a rank (exit %d): relaunching %d rank(s) as %d stage(s) x %d replica(s) from "
                    "checkpoint step %d (%s)", cluster, code, ranks, pp.num_stages, ranks // pp.num_stages,
                    steps[-1], current)
