"""What the federated benchmarks share (`benchmarks/federated.py`, `benchmarks/_fedflower.py`, `benchmarks/secagg.py`):
lightweight clients, a throwaway federation of real processes, and what to read off it."""
from __future__ import annotations

import os
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

REPO = Path(__file__).resolve().parent.parent

from testbed.federation import LocalFederation
from testbed.procs import Procs

__all__ = ["REPO", "light_client", "_Fed", "_client_procs", "_cpu_s", "_mem", "_rounds"]


# ---- lightweight clients (their factory is named in the job file as benchmarks._fedbench:light_client)
class _LightClient:
    """A client with a small model whose local training is a fixed wait (cross-device clients)."""

    def __init__(self, seed: int, train_s: float, size: int, tensors: int = 1) -> None:
        self.rng = np.random.default_rng(seed)
        self.train_s, self.size, self.tensors = train_s, size, tensors

    def num_examples(self) -> int:
        return 100

    def get_parameters(self, config):
        q = self.size // self.tensors  # (the first tensor takes the remainder)
        return {f"w{i}" if self.tensors > 1 else "w": np.zeros(q + (self.size - q * self.tensors if i == 0 else 0),
                                                                 np.float32) for i in range(self.tensors)}

    def fit(self, parameters, config):
        time.sleep(self.train_s)
        return {k: v + np.float32(self.rng.normal() * 0.01) for k, v in parameters.items()}, 100, {}

    def evaluate(self, parameters, config):
        return 0.0, 1, {}


def light_client(cluster: str, index: int, num_clients: dict, train_s: float = 0.0, size: int = 1000,
                 tensors: int = 1):
    """Factory of the lightweight client (see _LightClient)."""
    from nebula.federated.client import Client

    cls = type("LightClient", (_LightClient, Client), {})
    return cls(seed=index, train_s=train_s, size=size, tensors=tensors)


# ---- a federation of real processes
class _Fed:
    """Clusters provisioned in a temporary directory, a switch server each (the harness's `LocalFederation`), run as
    deployed. With `live_peak`, glibc maps the allocations of 1 MiB and more of the processes started here (actors,
    clients) and unmaps them on free, so their peak measures what is live (they keep no freed memory then:
    `nebula.heap` leaves an operator's MALLOC_* settings alone); without it, they run as deployed too (what a
    comparison of round times needs)."""

    def __init__(self, clusters: list[str], live_peak: bool = True) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="flbench-"))
        self.procs = Procs()
        self.env = {"MALLOC_MMAP_THRESHOLD_": "1048576"} if live_peak else {}
        federation = LocalFederation(self.dir / "prov", clusters, procs=self.procs, name="flbench")
        self.switches = [federation.switches[c].proc for c in clusters]

    def start(self, args: list[str]) -> subprocess.Popen:
        return self.procs.start(args, env=self.env)

    def py(self, *args: str) -> subprocess.Popen:
        return self.start([sys.executable, *args])

    @staticmethod
    def wait_line(p: subprocess.Popen, needle: str, timeout_s: float) -> None:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            r, _, _ = select.select([p.stdout], [], [], 0.5)
            if r:
                line = p.stdout.readline()
                if needle in line:
                    return
                if not line:
                    break
        raise RuntimeError(f"no {needle!r} from {p.args}")

    def job(self, clusters: dict[str, int], **over) -> Path:
        doc = {"job": "bench", "mode": "federated", "controller": {"cluster": next(iter(clusters)),
                                                                    "dir": str(self.dir / "fl")},
               "clusters": [{"id": c, "worker": str(self.dir / "prov" / c / "worker.yaml"), "num_clients": n}
                            for c, n in clusters.items()],
               "client": {"factory": "benchmarks._fedbench:light_client", "args": {}},
               "rounds": 3, "deadline_s": 600, "validity": {"min_updates": 1}, "startup_timeout_s": 600}
        doc.update(over)
        path = self.dir / "job.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return path

    def close(self) -> None:
        self.procs.reap()


def _rounds(fed: _Fed) -> list:
    from nebula.federated.controller.trail import ModelTrail

    with ModelTrail(fed.dir / "fl" / "trail") as t:
        return t.rounds()


def _client_procs(fed: _Fed, job: Path, cluster: str, n: int, per_proc: int) -> list[subprocess.Popen]:
    """Clients of `cluster` in processes of `per_proc` threads each."""
    out = []
    code = ("import sys; from nebula.federated.run import run_clients; "
            "run_clients(sys.argv[1], sys.argv[2], [int(i) for i in sys.argv[3].split(',')])")
    for start in range(0, n, per_proc):
        idx = ",".join(str(i) for i in range(start, min(n, start + per_proc)))
        out.append(fed.py("-c", code, str(job), cluster, idx))
    return out


def _cpu_s(pid: int) -> float | None:
    """User + system CPU seconds `pid` has used (None once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _mem(pid: int) -> dict[str, int]:
    """VmRSS, VmHWM and RssAnon (private memory: not the switch's shared-memory arena) of `pid`, in bytes."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        k, _, v = line.partition(":")
        if k in ("VmRSS", "VmHWM", "RssAnon"):
            out[k] = int(v.split()[0]) * 1024
    return out
