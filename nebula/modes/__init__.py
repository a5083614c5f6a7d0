"""Run modes: one registry, each mode one entry point, the mode of a job chosen in one place (`mode_of`).

- `pipeline` (`mode: pipeline`, the default; `nebula launch`): the stage runner with `PipelineHooks` (Scenario II),
  or, for a cluster with a layer pipeline, `nebula.hybrid.run_hybrid`;
- `oneway` (`mode: oneway`; `nebula launch`): the stage runner with `OneWayHooks` (Scenario I);
- `data_parallel` (`mode: data_parallel`; `nebula launch`): the stage runner with `DataParallelHooks`;
- `federated` (`mode: federated`, `algorithm: rounds`; `nebula fl start`): `nebula.federated.run.start_rounds`;
- `fedoptima`, `owl` (`algorithm: fedoptima | owl`; `nebula fl start`): `nebula.federated.actors.run_actors`.

A launched mode's entry point is `(cfg, cluster, *, wiring, workdir) -> RunResult` (one rank; `nebula launch` runs
it on every rank); a federated mode's is `(job, job_file, cluster, role, index) -> StartResult` (one cluster's actors).
Entry points import their mode's code when called, so choosing a mode costs nothing. The names are
nebula.config.modes.ModeName (the job file's values, validated by configuration). See docs/architecture.md.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from nebula.config.modes import LAUNCHED, ModeName  # (LAUNCHED: re-exported)
from nebula.registry import Registry

__all__ = ["Mode", "MODES", "ModeName", "LAUNCHED", "StartResult", "mode_of", "run", "start"]


@dataclass(frozen=True, slots=True)
class Mode:
    """A run mode: its name, the command that starts it (`launch` or `fl`) and its entry point."""

    name: ModeName
    command: str
    entry: Callable[..., Any]
    summary: str


@dataclass(frozen=True, slots=True)
class StartResult:
    """What one cluster's actors of a federated mode did: the line `nebula fl start` prints, its exit code, and the
    result itself (rounds trained, head version, or each actor's result)."""

    line: str
    code: int = 0
    result: Any = None


MODES: Registry[Mode] = Registry("run mode", known="modes")


def mode_of(job: Any) -> str:
    """The run mode of a loaded job: a job file's `mode` (pipeline, oneway, data_parallel) or, for a federated job,
    its `algorithm` (rounds: the federated mode). A job as one cluster runs it (`JobConfig.intra`,
    `JobConfig.in_one_cluster`) states the mode its ranks run."""
    algorithm = getattr(job, "algorithm", None)
    if algorithm is not None:  # a FederatedJob
        return ModeName.FEDERATED if algorithm == "rounds" else algorithm
    return job.mode


def run(cfg: Any, cluster: str, *, wiring: Any = None, workdir: str | Path | None = None) -> Any:
    """Train this rank's part of job `cfg` on `cluster` in the job's mode (rank and world from
    paddle.distributed.launch's env); `wiring` replaces the switch channels in in-process tests. The RunResult."""
    mode = MODES.get(mode_of(cfg))
    if mode.command != "launch":
        raise ValueError(f"job {cfg.job!r} is of mode {mode.name}: start it with `nebula fl start`")
    return mode.entry(cfg, cluster, wiring=wiring, workdir=workdir)


def start(job_file: str | Path, cluster: str, role: str = "cluster", index: int = 0) -> StartResult:
    """Run `cluster`'s actors (`role`, client `index`) of the federated job in `job_file` until its run ends."""
    from nebula.federated.config import load_federated_job

    job = load_federated_job(job_file)
    mode = MODES.get(mode_of(job))
    return mode.entry(job, job_file, cluster, role, index)


# ---- the modes --------------------------------------------------------------------------------------------------
def _pipeline(cfg: Any, cluster: str, *, wiring: Any = None, workdir: Any = None) -> Any:
    if cfg.cluster(cluster).pipeline is not None:  # a layer pipeline inside this cluster (hybrid DP x PP)
        from nebula.hybrid.runner import run_hybrid

        return run_hybrid(cfg, cluster, workdir=workdir)
    from nebula.pipeline.runner import run_pipeline

    return run_pipeline(cfg, cluster, wiring=wiring, workdir=workdir)


def _oneway(cfg: Any, cluster: str, *, wiring: Any = None, workdir: Any = None) -> Any:
    from nebula.pipeline.oneway import run_oneway

    return run_oneway(cfg, cluster, wiring=wiring, workdir=workdir)


def _data_parallel(cfg: Any, cluster: str, *, wiring: Any = None, workdir: Any = None) -> Any:
    from nebula.dataparallel import run_data_parallel

    return run_data_parallel(cfg, cluster, wiring=wiring, workdir=workdir)


def _federated(job: Any, job_file: str | Path, cluster: str, role: str, index: int) -> StartResult:
    from nebula.federated.run import start_rounds

    line = start_rounds(job_file, cluster, role, index)
    return StartResult(line, 0, line)


def _actors(algorithm: str) -> Callable[..., StartResult]:
    """The entry point of FedOptima or OWL: `algorithm` names its ActorAlgorithm in nebula.federated.actors."""
    def entry(job: Any, job_file: str | Path, cluster: str, role: str, index: int) -> StartResult:
        from nebula.federated import actors

        res = actors.run_actors(job, cluster, getattr(actors, algorithm), role, index)
        return StartResult("RESULT " + json.dumps(res), 1 if res.get("errors") else 0, res)
    return entry


for _mode in (
        Mode(ModeName.PIPELINE, "launch", _pipeline, "stages in model order across clusters (Scenario II)"),
        Mode(ModeName.ONEWAY, "launch", _oneway,
             "sender clusters feed a receiver cluster, sync tensor back (Scenario I)"),
        Mode(ModeName.DATA_PARALLEL, "launch", _data_parallel,
             "a replica per cluster, averaged every sync_every steps"),
        Mode(ModeName.FEDERATED, "fl", _federated,
             "FEDn's rounds: controller with reducer, a combiner per cluster, clients"),
        Mode(ModeName.FEDOPTIMA, "fl", _actors("FEDOPTIMA"),
             "FedOptima: device-side auxiliary networks, a central server"),
        Mode(ModeName.OWL, "fl", _actors("OWL"), "OWL: worker-assisted model distribution"),
):
    MODES.add(_mode.name.value, _mode)
