"""The paths `benchmarks/relay.py` measures (raw TLS, raw ZeroMQ, the full path through two switch servers) and how it
measures them: throughput with the CPU time of every process of a path, and one-way latency."""
from __future__ import annotations

import json
import os
import queue
import socket
import threading
import time
from pathlib import Path

import yaml
import zmq

from nebula.channel import Endpoint
from security.tls import client_context, server_context
from testbed.federation import LocalFederation
from _receiver import RemoteReceiver  # (benchmarks/ is the running script's directory)
from _tunnels import Framed

KIB, MIB = 1024, 1024**2

__all__ = ["FullPath", "Switches", "TLSPair", "ZMQPair", "cpu_seconds", "latency", "switch_status", "thread_cpu",
           "throughput", "without_shared_memory"]


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


# ---- transports under test: each gives send(bytes) and recv() -> bytes, one sender and one receiver thread ----

class TLSPair(Framed):
    """One raw TLS stream on loopback with length-prefixed messages (the same certificates as the switches)."""

    def __init__(self, fed: dict, remote: bool = False) -> None:
        self.remote: RemoteReceiver | None = None
        self.pids: list[int] = []  # (processes of the path beyond the benchmark's own)
        a = yaml.safe_load(Path(fed["clusters"]["A"]["switch_yaml"]).read_text())
        base_a = Path(fed["clusters"]["A"]["dir"])
        base_b = Path(fed["clusters"]["B"]["dir"])
        files = lambda base: [str((base / a["tls"][k]).resolve()) for k in ("ca", "cert", "key", "crl")]  # noqa: E731
        cctx = client_context(*files(base_b))
        if remote:  # the server end in a process of its own
            self.remote = RemoteReceiver("tls", **dict(zip(("ca", "cert", "key", "crl"), files(base_a))))
            self.pids = [self.remote.pid]
            self.tx = cctx.wrap_socket(socket.create_connection(("127.0.0.1", self.remote.port)))
            self.tx.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return
        sctx = server_context(*files(base_a))
        lst = socket.create_server(("127.0.0.1", 0))
        port = lst.getsockname()[1]
        box: dict = {}

        def accept() -> None:
            c, _ = lst.accept()
            box["s"] = sctx.wrap_socket(c, server_side=True)

        t = threading.Thread(target=accept)
        t.start()
        raw = socket.create_connection(("127.0.0.1", port))
        self.tx = cctx.wrap_socket(raw)
        t.join()
        lst.close()
        self.rx = box["s"]
        for s in (self.tx, self.rx):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def close(self) -> None:
        self.tx.close()
        if self.remote is not None:
            self.remote.close()
        else:
            self.rx.close()


class ZMQPair:
    """Raw ZeroMQ PUSH/PULL over TCP loopback; with `curve`, encrypted like a remote worker's link to its switch;
    with `ipc`, over a Unix socket like the link of a worker on the switch's own host."""

    def __init__(self, curve: bool = False, ipc: bool = False) -> None:
        self.ctx = zmq.Context()
        self.rx = self.ctx.socket(zmq.PULL)
        self.tx = self.ctx.socket(zmq.PUSH)
        if curve:
            server_public, server_secret = zmq.curve_keypair()
            self.rx.curve_server = True
            self.rx.curve_secretkey = server_secret
            self.tx.curve_publickey, self.tx.curve_secretkey = zmq.curve_keypair()
            self.tx.curve_serverkey = server_public
        if ipc:
            endpoint = f"ipc://@nebula-relay-bench-{os.getpid()}-{time.monotonic_ns()}"
            self.rx.bind(endpoint)
            self.tx.connect(endpoint)
        else:
            port = self.rx.bind_to_random_port("tcp://127.0.0.1")
            self.tx.connect(f"tcp://127.0.0.1:{port}")

    def send(self, data: bytes) -> None:
        self.tx.send(data, copy=len(data) < 65536)

    def recv(self) -> bytes:
        return self.rx.recv(copy=False).buffer

    def close(self) -> None:
        self.tx.close(0)
        self.rx.close(0)
        self.ctx.term()


class FullPath:
    """Worker A -> switch A -> TLS -> switch B -> worker B through nebula.channel."""

    def __init__(self, fed: dict, name: str = "bench", lane: str = "activation", rank: int = 0,
                 files: dict | None = None, remote: bool = False) -> None:
        self.remote: RemoteReceiver | None = None
        self.pids: list[int] = []  # (processes of the path beyond the benchmark's own and the switches')
        files = files or {c: fed["clusters"][c]["worker_yaml"] for c in ("A", "B")}
        if remote:  # worker B in a process of its own
            self.remote = RemoteReceiver("nebula", worker_yaml=files["B"], job="bench", rank=rank, peer="A", name=name)
            self.pids = [self.remote.pid]
        else:
            self.eb = Endpoint.connect(files["B"], job="bench", rank=rank)
            self.rx = self.eb.channel("A", rank, name)
        self.ea = Endpoint.connect(files["A"], job="bench", rank=rank)
        self.tx = self.ea.channel("B", rank, name)
        self.lane = lane

    def send(self, data: bytes) -> None:
        self.tx.send(data, lane=self.lane)

    def recv(self) -> bytes:
        return self.rx.recv(timeout_s=120)

    def close(self) -> None:
        self.ea.close(flush_s=5)
        if self.remote is not None:
            self.remote.close()
        else:
            self.eb.close(flush_s=0)


def without_shared_memory(fed: dict, tmp: Path) -> dict[str, str]:
    """Copies of both clusters' worker files with `shared_memory: false`."""
    out = {}
    for c in ("A", "B"):
        src = Path(fed["clusters"][c]["worker_yaml"])
        d = yaml.safe_load(src.read_text())
        d.update(curve_key=str((src.parent / d["curve_key"]).resolve()), shared_memory=False)
        out[c] = str(tmp / f"worker-{c}-no-shm.yaml")
        Path(out[c]).write_text(yaml.safe_dump(d))
    return out


def switch_status(fed: dict, cluster: str) -> dict:
    """The status a running switch of the federation last wrote."""
    from nebula.config import load_switch_config
    from switch_server.server import status_path

    return json.loads(status_path(load_switch_config(fed["clusters"][cluster]["switch_yaml"])).read_text())


def cpu_seconds(pids: list[int]) -> float:
    """CPU time (user + system, all threads) used so far by the processes `pids` (Linux /proc)."""
    total = 0.0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def thread_cpu(pids: list[int]) -> dict[tuple[int, int], tuple[str, float]]:
    """(pid, thread id) -> (thread name, CPU seconds so far) for every thread of the processes `pids`."""
    out = {}
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                name = (task / "comm").read_text().strip()
                fields = (task / "stat").read_text().rpartition(")")[2].split()
            except OSError:  # the thread ended meanwhile
                continue
            out[(pid, int(task.name))] = (name, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"))
    return out


def throughput(pair, size: int, n: int, cpu: dict | None = None) -> float:
    """MB/s of `n` messages of `size` bytes streamed back to back; `cpu["ms_per_mib"]` gets the CPU time that
    the processes `cpu["pids"]` spent per MiB (where the time goes, beyond wall-clock throughput), `cpu["each"]`
    that of each process, and `cpu["busiest"]` (ms per MiB, pid, name) of the busiest thread: with a core for
    every busy thread, that thread would set the throughput."""
    data = os.urandom(size)
    each0 = [cpu_seconds([p]) for p in cpu["pids"]] if cpu is not None else []
    threads0 = thread_cpu(cpu["pids"]) if cpu is not None else {}
    remote = getattr(pair, "remote", None)
    if remote is not None:  # the receiver is a process of its own: it says when the last message arrived
        remote.expect(n)
        t0 = time.perf_counter()
        for _ in range(n):
            pair.send(data)
        dt = remote.finished() - t0
        if cpu is not None:
            threads1 = thread_cpu(cpu["pids"])
            _cpu_use(cpu, size * n / MIB, each0, threads0, threads1, [])
        return size * n / dt / 1e6
    done = threading.Event()
    rx_cpu: dict = {}

    def rx() -> None:
        rx_cpu["tid"], t0 = threading.get_native_id(), time.thread_time()
        for _ in range(n):
            pair.recv()
        rx_cpu["s"] = time.thread_time() - t0
        done.set()

    t = threading.Thread(target=rx)
    t.start()
    t0 = time.perf_counter()
    for _ in range(n):
        pair.send(data)
    done.wait()
    dt = time.perf_counter() - t0
    threads1 = thread_cpu(cpu["pids"]) if cpu is not None else {}
    t.join()
    if cpu is not None:
        mib = size * n / MIB
        threads1 = {k: v for k, v in threads1.items() if k[1] != rx_cpu["tid"]}
        _cpu_use(cpu, mib, each0, threads0, threads1, [(rx_cpu["s"] * 1e3 / mib, os.getpid(), "receiver")])
    return size * n / dt / 1e6


def _cpu_use(cpu: dict, mib: float, each0: list[float], threads0: dict, threads1: dict, busy: list) -> None:
    """Fill `cpu` (see `throughput`) from the CPU times before (`each0`, `threads0`) and after."""
    cpu["each"] = [(cpu_seconds([p]) - c0) * 1e3 / mib for p, c0 in zip(cpu["pids"], each0)]
    cpu["ms_per_mib"] = sum(cpu["each"])
    for (pid, tid), (name, c1) in threads1.items():
        busy.append(((c1 - threads0.get((pid, tid), (name, 0.0))[1]) * 1e3 / mib, pid, name))
    cpu["busiest"] = max(busy)


def latency(pair, size: int, k: int) -> list[float]:
    """One-way latencies (seconds) of `k` messages sent one at a time (a receiver thread stamps arrivals)."""
    data = os.urandom(size)
    remote = getattr(pair, "remote", None)
    if remote is not None:
        remote.expect(k, each=True)
        out = []
        for _ in range(k):
            t0 = time.perf_counter()
            pair.send(data)
            out.append(remote.arrival() - t0)
        return out
    arrived: queue.SimpleQueue = queue.SimpleQueue()

    def rx() -> None:
        for _ in range(k):
            pair.recv()
            arrived.put(time.perf_counter())

    t = threading.Thread(target=rx)
    t.start()
    out = []
    for _ in range(k):
        t0 = time.perf_counter()
        pair.send(data)
        out.append(arrived.get(timeout=300) - t0)
    t.join()
    return out


# ---- switch processes ----

class Switches:
    """Switch servers A and B of a federation provisioned under `root`, as real processes (the harness's
    `LocalFederation`); `edit(cluster, doc)` changes a switch.yaml before its start, `sites` puts each switch in its
    cluster's network namespace. `fed` is what provisioning returned."""

    def __init__(self, root: Path, edit=None, sites=None) -> None:
        self.federation = LocalFederation(root, ["A", "B"], name="bench", edit=edit, sites=sites)
        self.fed = self.federation.summary
        self.procs = [self.federation.switches[c].proc for c in ("A", "B")]

    def close(self) -> None:
        self.federation.close()
