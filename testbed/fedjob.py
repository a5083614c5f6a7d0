"""A real federation for tests and benchmarks: provisioned switches on loopback, a federated job file, actor processes."""
from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from testbed.federation import start_switches

__all__ = ["federation", "write_job", "start_cluster", "start_client", "start_clients", "wait_exit", "run_job"]


def federation(procs, tmp: Path, clusters=("A", "B")) -> dict[str, Path]:
    """Provision `clusters` and start their switch servers; worker files by cluster."""
    return start_switches(procs, tmp / "prov", list(clusters))


def write_job(tmp: Path, workers: dict[str, Path], num_clients: dict[str, int], **over) -> Path:
    """A federated job file with the toy client; `over` replaces top-level keys."""
    doc = {
        "job": "fltest", "mode": "federated", "controller": {"cluster": "A", "dir": str(tmp / "fl")},
        "clusters": [{"id": c, "worker": str(w), "num_clients": num_clients.get(c, 0)} for c, w in workers.items()],
        "client": {"factory": "testbed.toy_client:make_client", "args": {}},
        "rounds": 2, "deadline_s": 20, "validity": {"min_updates": 1}, "strategy": {"name": "fedavg"},
        "startup_timeout_s": 60,
    }
    doc.update(over)
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / "job.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def start_cluster(procs, job: Path, cluster: str, role: str = "cluster") -> subprocess.Popen:
    """Start the combiner (and controller, in its cluster) of `cluster`."""
    return procs.python("-m", "nebula.federated.run", role, str(job), "--cluster", cluster)


def start_client(procs, job: Path, cluster: str, index: int) -> subprocess.Popen:
    """Start client `index` of `cluster`."""
    p = procs.python("-m", "nebula.federated.run", "client", str(job), "--cluster", cluster, "--index", str(index))
    return p


def start_clients(procs, job: Path, cluster: str, indices: list[int] | None = None) -> subprocess.Popen:
    """Start every client of `cluster` (or those of `indices`) in one process (a thread and a switch connection
    each)."""
    if indices is None:
        return procs.python("-m", "nebula.federated.run", "clients", str(job), "--cluster", cluster)
    code = ("import sys; from nebula.federated.run import run_clients; "
            "run_clients(sys.argv[1], sys.argv[2], [int(i) for i in sys.argv[3].split(',')])")
    return procs.python("-c", code, str(job), cluster, ",".join(map(str, indices)))


def wait_exit(p: subprocess.Popen, timeout_s: float) -> str:
    """Wait for `p` to exit 0; its output (fails the test with it otherwise)."""
    out, _ = p.communicate(timeout=timeout_s)
    assert p.returncode == 0, f"exit {p.returncode}:\n{out[-4000:]}"
    return out



def run_job(procs, job: Path, clusters=("A", "B"), timeout_s: float = 120) -> str:
    """Start every cluster's actors (the controller in the first) and all its clients, wait until every process
    has exited 0; the controller's output."""
    actors = [start_cluster(procs, job, c) for c in clusters]
    clients = [start_clients(procs, job, c) for c in clusters]
    out = wait_exit(actors[0], timeout_s)
    for p in actors[1:] + clients:
        wait_exit(p, 30)
    return out
