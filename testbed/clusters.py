"""Toy jobs (`toy_job`: the toy recipe over clusters and stages) and the recovery runs built on them: toy jobs of
each launched mode with whole-job recovery on, one cluster killed (every rank, SIGKILL) and launched again, and
the metrics the clusters wrote read back."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import yaml

from nebula.pipeline import read_metrics
from testbed.procs import Procs


def toy_job(tmp: Path, *, clusters: list[dict[str, Any]], stages: list[dict[str, str]], steps: int = 4,
            global_batch: int = 16, micro_batches: int = 2, name: str = "job.yaml", recipe_args: dict | None = None,
            **extra: Any) -> Path:
    """Write a toy job file into `tmp` and return its path."""
    doc = {
        "job": "toy",
        "recipe": {"factory": "recipes.toy:ToyRecipe", "args": recipe_args or {}},
        "clusters": clusters,
        "stages": stages,
        "train": {"steps": steps, "global_batch": global_batch, "micro_batches": micro_batches, "seed": 3},
        "metrics": {"dir": "metrics", "progress": False},
        **extra,
    }
    path = tmp / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


EVERY = 5  # checkpoint interval of the recovery jobs

MODES: dict[str, dict[str, Any]] = {
    "pipeline": {"stages": [{"name": "embed", "cluster": "A"}, {"name": "head", "cluster": "B"}]},
    "oneway": {"stages": [{"name": "gen", "cluster": "A"}, {"name": "disc", "cluster": "B"}], "mode": "oneway",
               "oneway": {"k": 2, "sync_lag": 1}, "recipe_args": {"oneway": True}},
    "oneway3": {"stages": [{"name": "gen1", "cluster": "A"}, {"name": "gen2", "cluster": "B"},
                           {"name": "disc", "cluster": "C"}], "mode": "oneway", "oneway": {"k": 1, "sync_lag": 1},
                "recipe_args": {"oneway": True, "num_stages": 3}},
    "data_parallel": {"stages": [], "mode": "data_parallel",
                      "data_parallel": {"sync_every": 1, "outer": {"algorithm": "average", "codec": "none"}}},
}


def recovery_job(tmp: Path, mode: str, workers: dict[str, Any], *, steps: int, procs: dict[str, int] | None = None,
                 peer_timeout_s: float = 4, recovery_timeout_s: float = 120, **extra: Any) -> Path:
    """A toy job of `mode` over the clusters of `workers` (`procs` ranks each, default 1) with recovery on and a
    checkpoint every EVERY steps."""
    spec = dict(MODES[mode])
    stages = spec.pop("stages")
    clusters = [{"id": c, "procs_per_node": (procs or {}).get(c, 1), "worker": str(w)} for c, w in workers.items()]
    path = toy_job(tmp, clusters=clusters, stages=stages, steps=steps, peer_timeout_s=peer_timeout_s,
                   recovery_timeout_s=recovery_timeout_s, startup_timeout_s=120,
                   checkpoint={"dir": "ckpt", "every": EVERY, "keep": 3}, **{**spec, **extra})
    if not stages:  # data_parallel lists none
        doc = yaml.safe_load(path.read_text())
        del doc["stages"]
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def start_rank(procs: Procs, job: Path, cluster: str, log: Path) -> subprocess.Popen:
    """Cluster `cluster` of one rank: the rank itself (what `nebula launch` starts), no launcher around it."""
    out = open(log, "a")  # (closed when the child exits; the reaper ends it)
    return procs.start([sys.executable, "-m", "nebula.launch.worker", "--job", str(job), "--cluster", cluster],
                       cwd=str(job.parent), stdout=out, stderr=subprocess.STDOUT)


def metrics(tmp: Path, cluster: str, rank: int = 0) -> list[dict]:
    path = tmp / "metrics" / f"{cluster}.rank{rank}.jsonl"
    return read_metrics(path) if path.exists() else []


def events(tmp: Path, cluster: str, rank: int = 0) -> list[dict]:
    path = tmp / "metrics" / "recovery" / f"{cluster}.rank{rank}.jsonl"
    return read_metrics(path) if path.exists() else []


def wait_steps(tmp: Path, cluster: str, n: int, timeout_s: float, procs: Sequence[subprocess.Popen] = ()) -> None:
    """Wait until `cluster`'s rank 0 recorded `n` steps (fail early when one of `procs` exits)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if len(metrics(tmp, cluster)) >= n:
            return
        for p in procs:
            if p.poll() is not None:
                raise AssertionError(f"a cluster exited ({p.returncode}) before {cluster} reached step {n}")
        time.sleep(0.05)
    raise AssertionError(f"cluster {cluster} did not reach {n} steps in {timeout_s} s")


def kill_cluster(p: subprocess.Popen, rank_dir: Path | None = None) -> None:
    """SIGKILL every process of a cluster: its launcher (or its one rank) and everything in its process group, and
    the ranks a launcher recorded in `rank_dir` (they run in sessions of their own)."""
    pids = rank_pids(rank_dir) if rank_dir is not None else []
    os.killpg(p.pid, signal.SIGKILL)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    p.wait(10)


def rank_pids(rank_dir: Path) -> list[int]:
    """The process ids of the ranks of a cluster's current launch (`<log dir>/ranks/rank<N>.pid`)."""
    return [int(f.read_text()) for f in sorted(Path(rank_dir).glob("rank*.pid"))]


def kill_ranks(rank_dir: Path, n: int, timeout_s: float = 120) -> list[int]:
    """SIGKILL the `n` ranks of a cluster's current launch (its launcher, or supervisor, is left alone)."""
    deadline = time.monotonic() + timeout_s
    while len(pids := rank_pids(rank_dir)) < n:
        if time.monotonic() > deadline:
            raise AssertionError(f"{rank_dir} lists {len(pids)} of {n} ranks")
        time.sleep(0.1)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return pids


def same_loss_each_time(records: list[dict]) -> dict[int, float]:
    """Every step recorded more than once (redone after a recovery) has exactly the loss it had the first time:
    the data of a step is a pure function of the step, and model and optimizer come from the checkpoint. The loss
    of each step."""
    first: dict[int, float] = {}
    for r in records:
        if r["loss"] is None:
            continue
        assert first.setdefault(r["step"], r["loss"]) == r["loss"], (r["step"], r["loss"], first[r["step"]])
    return first


def redone(tmp: Path, clusters: Sequence[str], recovered: dict) -> int:
    """Steps done before a recovery and done again after it: from the step resumed from to the newest step any
    cluster had done before the recovery (`recovered`: a survivor's event; every step recorded before the
    agreement was done before it, every step after it, after)."""
    before = [r["step"] for c in clusters for r in metrics(tmp, c) if r["time"] < recovered["time"]]
    return max(before) + 1 - recovered["step"]
