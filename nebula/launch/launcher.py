"""Start one cluster's part of a job: `python -m paddle.distributed.launch ... nebula/launch/worker.py`."""
from __future__ import annotations

import logging
import os
import shlex
import sys
from pathlib import Path
from typing import Callable

from nebula.launch.quiet import silence_paddle_import

silence_paddle_import()  # (before the job's recipe, which imports paddle, is loaded to validate the job)

from nebula.config.job import JobConfig  # noqa: E402
from nebula.launch.departures import RANK_DIR_ENV, clear_failures, failures  # noqa: E402
from nebula.launch.preflight import load_for_cluster, validate_job  # noqa: E402
from nebula.launch.quiet import child_env, launch_log_path, run_stoppable, signal_name  # noqa: E402

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
    """Validate, then run this cluster's ranks to completion; returns the launcher's exit code (128 + the
    signal when a signal to this process stopped it: `quiet.STOPPED_CODES`). The ranks' output reaches our stdout;
    paddle.distributed.launch's own log lines go to <log_dir>/launch.log. `report` gets the lines for the
    operator: when the ranks finish, the cluster's summary; when they fail, each rank's one-line reason for
    stopping (once, however often paddle shows the rank's log); when stopped, one line."""
    cfg = prepare(job_file, cluster, intra=intra)
    if log_dir is None:
        log_dir = log_dir_of(cfg, cluster)
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    cmd = build_command(job_file, cfg, cluster, intra=intra, node_rank=node_rank, log_dir=log_dir)
    launch_log = launch_log_path(log_dir).resolve()
    log.info("cluster %s: starting %d rank(s) on this node; paddle.distributed.launch's log: %s", cluster,
             cfg.cluster(cluster).procs_per_node, launch_log)
    env = child_env(os.environ)
    rank_dir = log_dir.resolve() / "ranks"
    env[RANK_DIR_ENV] = str(rank_dir)  # (each rank records its pid, and why it stopped: who left, if any)
    clear_failures(rank_dir)
    with open(launch_log, "a", encoding="utf-8") as out:
        out.write(f"$ {shlex.join(cmd)}\n")
        out.flush()
        code, stopped_by = run_stoppable(cmd, env, out)
    say = report or log.warning
    if stopped_by is not None:
        say(f"nebula launch: cluster {cluster} stopped ({signal_name(stopped_by)}); the ranks' logs are in "
            f"{log_dir.resolve()}")
        return 128 + stopped_by
    if code == 0:
        _say_summary(cfg, cluster, report or log.info)
        return 0
    reasons = failures(rank_dir)
    for line in reasons:
        say(line)
    if not reasons:  # a rank that crashed (its output above), or paddle's launcher itself (its log says)
        say(f"nebula launch: cluster {cluster} failed (exit {code}); the ranks' logs are in {log_dir.resolve()}, "
            f"paddle.distributed.launch's in {launch_log}")
    return code


def _say_summary(cfg: JobConfig, cluster: str, say: Callable[[str], None]) -> None:
    """The cluster's summary from its metrics files (nothing when the job writes none)."""
    from nebula.launch.summary import cluster_summary

    metrics = Path(cfg.metrics.dir or ".")
    try:
        line = cluster_summary(metrics, cluster).line()
    except (OSError, ValueError):  # (no metrics: a mode that writes none, or metrics.dir unset)
        return
    say(f"nebula launch: {line}; metrics in {metrics.resolve()}")
