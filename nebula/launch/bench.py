"""`nebula bench`'s launcher: start a cluster's ranks under paddle.distributed.launch to run the device benchmark."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from nebula.config.job import JobConfig
from nebula.launch.launcher import prepare

__all__ = ["BENCH_WORKER", "bench_command", "bench_cluster"]

BENCH_WORKER = Path(__file__).resolve().parent / "bench_worker.py"  # per-rank entry point of the device benchmark


def bench_command(job_file: str | Path, cfg: JobConfig, cluster: str, out: str | Path,
                  log_dir: str | Path | None = None) -> list[str]:
    """The paddle.distributed.launch command that benchmarks `cluster`'s ranks on this node."""
    spec = cfg.cluster(cluster)
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nnodes", str(spec.nodes),
           "--nproc_per_node", str(spec.procs_per_node), "--job_id", f"{cfg.job}-{cluster}-bench"]
    if spec.nodes > 1:
        cmd += ["--master", str(spec.master)]
    if log_dir is not None:
        cmd += ["--log_dir", str(log_dir)]
    return cmd + [str(BENCH_WORKER), "--job", str(Path(job_file).resolve()), "--cluster", cluster, "--out",
                  str(Path(out).resolve())]


def bench_cluster(job_file: str | Path, cluster: str, out: str | Path, log_dir: str | Path | None = None) -> int:
    """Benchmark `cluster`'s ranks; rank 0 writes `out`. Returns the launcher's exit code."""
    cfg = prepare(job_file, cluster, allocate=False)  # the profiles `allocation:` reads are what this writes
    if log_dir is None:
        log_dir = Path(cfg.metrics.dir or ".") / "log" / f"{cluster}-bench"
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return subprocess.call(bench_command(job_file, cfg, cluster, out, log_dir), env=env)
