"""Job preflight: the job as one cluster runs it (`load_for_cluster`: the launcher and every rank it starts load it
the same way, so all get the same cut), and what a YAML schema cannot check (recipe stages, switch files, hot-start
checkpoint) before any process starts (`validate_job`)."""
from __future__ import annotations

from pathlib import Path

from nebula.config.schema import ConfigError
from nebula.config.job import JobConfig, load_job_config
from nebula.config.worker import load_worker_config
from nebula.config.modes import ModeName

__all__ = ["load_for_cluster", "validate_job"]


def load_for_cluster(job_file: str | Path, cluster: str, *, intra: bool = False, allocate: bool = True) -> JobConfig:
    """The job file as `cluster` runs it: loaded, its `allocation:` between clusters resolved from the clusters'
    profiles (`allocate=False` leaves it: the device benchmark runs before the profiles exist), and with `intra`
    every stage moved into `cluster`."""
    cfg = load_job_config(job_file)
    if cfg.allocation is not None and allocate:
        from nebula.hybrid.plan import resolve_allocation  # late: the allocators import scipy

        cfg = resolve_allocation(cfg)
    return cfg.intra(cluster) if intra else cfg


def validate_job(cfg: JobConfig, cluster: str | None = None) -> list[str]:
    """Check what a YAML schema cannot before any process starts; raise ConfigError, return the recipe's stages.

    Checks (codec specs are already checked on load): the recipe imports and its stages are exactly the configured ones, every cluster taking
    part in an inter-cluster job has a switch (a worker.yaml for that cluster, which must exist here for `cluster`, or
    for every cluster when none is given), and `cluster` (if given) is one of the job's clusters.
    """
    dp = cfg.mode == ModeName.DATA_PARALLEL  # every cluster runs every stage and averages with the others over the WAN
    taking_part = [c.id for c in cfg.clusters] if dp else [c for c, _ in cfg.segments]
    if cluster is not None and cluster not in taking_part:
        raise ConfigError(f"cluster {cluster!r} runs no stage of job {cfg.job!r}; stages run on "
                          f"{', '.join(taking_part)}")
    if cfg.inter_cluster or (dp and len(taking_part) > 1):
        for cid in taking_part:
            c = cfg.cluster(cid)
            if not c.worker:
                raise ConfigError(f"cluster {cid!r} has no switch: set clusters[{cid}].worker to its worker.yaml "
                                  "(written by nebula-admin provision)")
            if cluster is not None and cid != cluster:
                continue  # (another cluster's file lies on that cluster's own host, not here)
            if not Path(c.worker).is_file():
                raise ConfigError(f"cluster {cid!r}: switch connection file {c.worker} does not exist; run "
                                  "nebula-admin provision or fix clusters[].worker")
            _check_worker_file(c.worker, cid)
    if cfg.checkpoint.init_from:
        from nebula.pipeline.checkpoint import checkpoint_step  # late: pipeline imports paddle

        try:
            checkpoint_step(cfg.checkpoint.init_from)
        except (FileNotFoundError, ValueError, KeyError) as exc:
            raise ConfigError(f"checkpoint.init_from: {exc}") from exc
    from nebula.pipeline.stage import load_recipe  # late: pipeline imports paddle

    recipe = load_recipe(cfg.recipe)
    names = list(recipe.stage_names)
    got = [s.name for s in cfg.stages]
    if not dp and got != names:
        raise ConfigError(f"stages {got} do not fit the model of recipe {cfg.recipe.factory}: it has stages {names} "
                          "(in this order); list each exactly once")
    return names


def _check_worker_file(path: str, cluster: str) -> None:
    try:
        w = load_worker_config(path)
    except Exception as exc:  # noqa: BLE001
        raise ConfigError(f"cluster {cluster!r}: {exc}") from exc
    if w.cluster != cluster:
        raise ConfigError(f"cluster {cluster!r}: worker file {path} belongs to cluster {w.cluster!r}; point "
                          f"clusters[{cluster}].worker at {cluster}'s worker.yaml")
