"""Start one cluster's part of a job: `python -m paddle.distributed.launch ... nebula/launch/worker.py`."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

from nebula.config.job import JobConfig
from nebula.launch.departures import RANK_DIR_ENV, clear_failures, failures
from nebula.launch.preflight import load_for_cluster, validate_job

__all__ = ["prepare", "build_command", "launch", "log_dir_of", "WORKER_SCRIPT"]

log = logging.getLogger(__name__)

WORKER_SCRIPT = Path(__file__).resolve().parent / "worker.py"


def prepare(job_file: str | Path, cluster: str, *, intra: bool = False, allocate: bool = True) -> JobConfig:
    """Load and fully validate the job for `cluster` (ConfigError before any process starts); `allocate=False`
    leaves `allocation:` unresolved (the device benchmark runs before the profiles it needs exist)."""
    cfg = load_for_cluster(job_file, cluster, intra=intra, allocate=allocate)
    validate_job(cfg, cluster)
    return cfg


def log_dir_of(cfg: JobConfig, cluster: str) -> Path:
    """Where `launch` keeps `cluster`'s rank logs (and, under ranks/, their process ids) by default."""
    return Path(cfg.metrics.dir or ".") / "log" / cluster


def build_command(job_file: str | Path, cfg: JobConfig, cluster: str, *, intra: bool = False, node_rank: int = 0,
                  log_dir: str | Path | None = None) -> list[str]:
    """The paddle.distributed.launch command line that starts `cluster`'s ranks on this node."""
    spec = cfg.cluster(cluster)
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nnodes", str(spec.nodes),
           "--nproc_per_node", str(spec.procs_per_node), "--job_id", f"{cfg.job}-{cluster}"]
    if spec.nodes > 1:
        cmd += ["--master", str(spec.master), "--rank", str(node_rank)]
    if log_dir is not None:
        cmd += ["--log_dir", str(log_dir)]
    cmd += [str(WORKER_SCRIPT), "--job", str(Path(job_file).resolve()), "--cluster", cluster]
    if intra:
        cmd.append("--intra")
    return cmd


def launch(job_file: str | Path, cluster: str, *, intra: bool = False, node_rank: int = 0,
           log_dir: str | Path | None = None, report: Callable[[str], None] | None = None) -> int:
    """Validate, then run this cluster's ranks to completion; returns the launcher's exit code. When it fails,
    `report` gets each rank's one-line reason for stopping (once, however often paddle shows the rank's log)."""
    cfg = prepare(job_file, cluster, intra=intra)
    if log_dir is None:
        log_dir = log_dir_of(cfg, cluster)
    cmd = build_command(job_file, cfg, cluster, intra=intra, node_rank=node_rank, log_dir=log_dir)
    log.info("cluster %s: starting %d rank(s) on this node: %s", cluster, cfg.cluster(cluster).procs_per_node,
             " ".join(cmd))
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    rank_dir = Path(log_dir).resolve() / "ranks"
    env[RANK_DIR_ENV] = str(rank_dir)  # (each rank records its pid, and why it stopped: who left, if any)
    clear_failures(rank_dir)
    code = subprocess.call(cmd, env=env)
    if code != 0 and report is not None:
        for line in failures(rank_dir):
            report(line)
    return code
