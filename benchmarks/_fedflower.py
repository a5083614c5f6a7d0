"""`benchmarks/federated.py --only flower`: round time on the encrypted path against Flower's FedAvg."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

from _fedbench import REPO, _Fed, _client_procs, _mem, _rounds

__all__ = ["bench_flower", "flower_python"]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def flower_python(given: str | None) -> str | None:
    """An interpreter that has `flwr`: `given`, else /work/venv-flwr's, else this one if it has it (None: none)."""
    for py in ([given] if given else []) + [str(Path("/work/venv-flwr/bin/python")), sys.executable]:
        if Path(py).exists() and subprocess.run([py, "-c", "import flwr"], capture_output=True).returncode == 0:
            return py
    return None


def _flower_round_s(py: str, floats: int, n: int, rounds: int, per_proc: int, tmp: Path) -> list[float]:
    """Round times of Flower's FedAvg (legacy gRPC, server-authenticated TLS) over `n` clients of the same model."""
    port, script = _free_port(), str(REPO / "benchmarks" / "_flower.py")
    common = ["--port", str(port), "--floats", str(floats), "--certs", str(tmp / "flower-certs")]
    subprocess.run([py, "-c", f"import _flower; _flower.certificates(__import__('pathlib').Path({str(tmp / 'flower-certs')!r}))"],
                   cwd=REPO / "benchmarks", check=True)  # (`-c` puts its working directory first on its path)
    server = subprocess.Popen([py, script, "server", "--clients", str(n), "--rounds", str(rounds), *common],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    time.sleep(3)  # (the gRPC server binds)
    procs = [subprocess.Popen([py, script, "clients", "--count", str(min(per_proc, n - s)), *common],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
             for s in range(0, n, per_proc)]
    try:
        out, _ = server.communicate(timeout=1800)
    finally:
        for p in procs + [server]:
            if p.poll() is None:
                os.killpg(p.pid, 15)
    return json.loads(out.strip().splitlines()[-1])["round_s"]


def bench_flower(sizes: list[tuple[int, int]], rounds: int, per_proc: int, py: str | None,
                 remote: str = "tls") -> list[dict]:
    """Median round time (rounds 2..) of Nebula on the encrypted path and of Flower, for each (floats, clients);
    the same four-tensor model, fixed updates, FedAvg. Nebula's clients reach their switch in cluster B as from
    hosts of their own (`remote`: "tls", the switch's TLS endpoint for workers, or "tcp", CURVE), the controller
    in cluster A is behind mutual TLS between the switches, and the combiner is placed twice: on its switch's host
    (its worker file's `transport: auto` picks the same-host stream socket, as on a real site) and on another host
    (as the clients: every model byte is encrypted twice)."""
    rows = []
    for floats, n in sizes:
        row: dict = {"floats": floats, "clients": n}
        for combiner in ("switch_host", "remote"):
            row[combiner], peak = _nebula_encrypted_round(floats, n, rounds, per_proc, combiner, remote)
            row["switch_peak_mb"] = max(row.get("switch_peak_mb", 0.0), peak)
        tmp = Path(tempfile.mkdtemp(prefix="flower-bench-"))
        row["flower_s"] = statistics.median(_flower_round_s(py, floats, n, rounds, per_proc, tmp)) if py else None
        rows.append(row)
        print(f"  {rows[-1]}", file=sys.stderr, flush=True)
    return rows


def cycles(rounds: list) -> list[float]:
    """Whole round cycles from round 2 on, as Flower's are timed (from one round's end to the next's): from the
    start of round r to the start of round r + 1, the head's load, the roster and the trail's commit included
    (round 1 waits for every client to connect first)."""
    starts = [r.started for r in rounds[1:]]
    return [b - a for a, b in zip(starts, starts[1:])]


def _nebula_encrypted_round(floats: int, n: int, rounds: int, per_proc: int, combiner: str,
                            remote_transport: str = "tls") -> tuple[float, float]:
    """(median round s, switches' peak RSS MB) of one run of `bench_flower`'s Nebula path."""
    fed = _Fed(["A", "B"], live_peak=False)  # (every process as deployed, as Flower's)
    try:
        for c in ("A", "B"):
            wy = fed.dir / "prov" / c / "worker.yaml"
            doc = yaml.safe_load(wy.read_text())
            (wy.parent / "worker-remote.yaml").write_text(yaml.safe_dump({**doc, "transport": remote_transport}))
        job = fed.job({"A": 0, "B": n}, rounds=rounds, client={
            "factory": "benchmarks._fedbench:light_client", "args": {"size": floats, "tensors": 4}})
        remote = job.with_name("job-remote.yaml")  # the same job, as read on hosts other than the switches'
        remote.write_text(job.read_text().replace("/worker.yaml", "/worker-remote.yaml"))
        actors = job if combiner == "switch_host" else remote
        runs = [fed.py("-m", "nebula.federated.run", "cluster", str(actors), "--cluster", c) for c in ("A", "B")]
        for r in runs:
            threading.Thread(target=lambda q=r: [None for _ in q.stdout], daemon=True).start()
        _client_procs(fed, remote, "B", n, per_proc)
        runs[0].wait(1800)
        if runs[0].returncode:
            raise RuntimeError(f"controller exit {runs[0].returncode}")
        return (statistics.median(cycles(_rounds(fed))), max(_mem(p.pid)["VmHWM"] for p in fed.switches) / 1e6)
    finally:
        fed.close()
