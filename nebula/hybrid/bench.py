"""`nebula bench`: the device benchmark of one cluster, run on its real ranks, written as a profiles file.

The cluster's ranks start under paddle.distributed.launch exactly as for training; each runs the probe
(nebula.hybrid.probe) and rank 0 writes every rank's `DeviceProfile` and the cluster seen as one device (its
slowest rank's seconds per FLOP divided by its data-parallel ranks, its smallest memory) to a YAML file, which
the between-cluster allocation (`allocation:` in the job file) reads.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from nebula.config.job import JobConfig

__all__ = ["BENCH_WORKER", "bench_command", "bench_cluster", "write_profiles", "read_profiles", "cluster_profile"]

BENCH_WORKER = Path(__file__).resolve().parent / "bench_worker.py"


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
    from nebula.launch import prepare

    cfg = prepare(job_file, cluster)
    if log_dir is None:
        log_dir = Path(cfg.metrics.dir or ".") / "log" / f"{cluster}-bench"
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return subprocess.call(bench_command(job_file, cfg, cluster, out, log_dir), env=env)


def cluster_profile(ranks: list[dict], name: str) -> Any:
    """The cluster as one device for the between-cluster allocation: its data-parallel ranks share each stage's
    work (seconds per FLOP of the slowest over their number), every rank holds the whole stage (least memory)."""
    from nebula.balance import DeviceProfile

    tpf = max(r["compute_s"] / r["probe_flops"] for r in ranks) / len(ranks)
    return DeviceProfile(tpf, min(r["free_memory_bytes"] for r in ranks), name=name)


def write_profiles(path: str | Path, cluster: str, device: str, ranks: list[dict]) -> Path:
    """Write the benchmark of one cluster: per-rank measurements and profiles, and the cluster as one device."""
    def prof(p: Any) -> dict:
        return {"time_per_flop_s": p.time_per_flop_s, "memory_bytes": p.memory_bytes, "latency_s": p.latency_s,
                "bandwidth_bytes_per_s": p.bandwidth_bytes_per_s}  # YAML writes inf as .inf

    from nebula.hybrid.probe import RankProbe

    probes = [RankProbe(**r) for r in ranks]
    doc = {"cluster": cluster, "device": device,
           "ranks": [{**r, "profile": prof(p.profile())} for r, p in zip(ranks, probes)],
           "profile": prof(cluster_profile(ranks, cluster))}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def read_profiles(path: str | Path) -> dict:
    """A profiles file: {'cluster', 'device', 'ranks': [...], 'profile': {...}}; ValueError naming what is wrong."""
    path = Path(path)
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"profiles file {path}: cannot read it ({exc}); run nebula bench to write it") from exc
    if not isinstance(doc, dict) or not {"cluster", "profile", "ranks"} <= set(doc):
        raise ValueError(f"profiles file {path} has no cluster/profile/ranks; write it with nebula bench")
    return doc
