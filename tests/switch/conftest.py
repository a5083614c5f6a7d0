"""Fixtures of the switch tests: a provisioned two-cluster federation (switches started by `testbed`), a cutting
proxy, a legitimate transfer to run beside an attack."""
from __future__ import annotations

import contextlib
import socket
import threading
from pathlib import Path

import pytest
import yaml

from security.provision import provision
from testbed.federation import Switch, edit_yaml, start_switch, wait_audit

__all__ = ["CuttingProxy", "Switch", "TEST_CHUNK_BYTES", "edit_yaml", "federation", "legit_transfer",
           "start_switch", "two_switches", "wait_audit", "worker_yaml", "exchange"]


TEST_CHUNK_BYTES = 256 * 1024


@pytest.fixture
def federation(tmp_path):
    """A provisioned two-cluster federation (A, B) on loopback; returns the provision summary.

    Chunks are pinned to 256 KiB so that the messages of a few hundred KB the tests send travel as several
    chunks whatever the default chunk size is.
    """
    fed = provision("fed", ["A", "B"], tmp_path / "fed")
    for c in ("A", "B"):
        edit_yaml(Path(fed["clusters"][c]["switch_yaml"]),
                  lambda d: d.setdefault("link", {}).update(chunk_bytes=TEST_CHUNK_BYTES))
    return fed


@pytest.fixture
def two_switches(procs, federation):
    """Switch servers A and B running and linked; returns (federation, A, B)."""
    a = start_switch(procs, Path(federation["clusters"]["A"]["switch_yaml"]))
    b = start_switch(procs, Path(federation["clusters"]["B"]["switch_yaml"]))
    return federation, a, b


def worker_yaml(federation, cluster: str) -> str:
    return federation["clusters"][cluster]["worker_yaml"]


def worker_yaml_as(federation, cluster: str, out: Path, **changes) -> str:
    """A copy of `cluster`'s worker file at `out` with `changes` (e.g. transport="ipc"), its key path absolute."""
    src = Path(worker_yaml(federation, cluster))
    doc = yaml.safe_load(src.read_text())
    if doc.get("tls"):
        doc["tls"] = {k: str(src.parent / v) for k, v in doc["tls"].items()}
    out.write_text(yaml.safe_dump({**doc, "curve_key": str(src.parent / doc["curve_key"]), **changes}))
    return str(out)


def exchange(ya: str | Path, yb: str | Path) -> tuple[str, str]:
    """Workers of `ya` (cluster A) and `yb` (cluster B) carry messages of every size both ways (inline and, where
    offered, through shared memory); the transports they took."""
    from nebula.channel import Endpoint

    with Endpoint.connect(ya, job="j", rank=0) as ea, Endpoint.connect(yb, job="j", rank=0) as eb:
        msgs = [b"small", bytes(range(256)) * 400, b"x" * 700_000]
        for m in msgs:
            ea.channel("B", 0, "s").send(m)
        assert [eb.channel("A", 0, "s").recv(timeout_s=30) for _ in msgs] == msgs
        eb.channel("A", 0, "s").send(b"back")
        assert ea.channel("B", 0, "s").recv(timeout_s=30) == b"back"
        return ea._io.transport, eb._io.transport


def legit_transfer(fed, n: int, job: str = "j", stages: dict[str, str] | None = None,
                   src: str = "B", dst: str = "A") -> tuple[threading.Thread, list]:
    """`src`'s worker sends `n` messages to `dst`'s (of `job`, declaring the job's `stages`) in a thread; the list
    gets what `dst` received, for the caller to check that nothing was lost while an attack ran."""
    from nebula.channel import Endpoint

    got: list[bytes] = []

    def run() -> None:
        with Endpoint.connect(worker_yaml(fed, dst), job=job, rank=0, stages=stages) as rx_ep, \
                Endpoint.connect(worker_yaml(fed, src), job=job, rank=0, stages=stages) as tx_ep:
            tx, rx = tx_ep.channel(dst, 0, "legit"), rx_ep.channel(src, 0, "legit")
            for i in range(n):
                tx.send(i.to_bytes(4, "big") * 1000)
            for _ in range(n):
                got.append(rx.recv(timeout_s=60))
    t = threading.Thread(target=run)
    t.start()
    return t, got


class CuttingProxy:
    """TCP proxy on loopback that forwards to `target` and can cut every live connection at once."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.conns: list[socket.socket] = []
        self.lock = threading.Lock()
        self.cuts = 0
        self.bytes = 0
        self.running = True
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while self.running:
            try:
                c, _ = self.listener.accept()
            except OSError:
                return
            try:
                u = socket.create_connection(self.target)
            except OSError:
                c.close()
                continue
            with self.lock:
                self.conns += [c, u]
            threading.Thread(target=self._pump, args=(c, u), daemon=True).start()
            threading.Thread(target=self._pump, args=(u, c), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            with contextlib.suppress(OSError):  # the other side or cut() closed the connection
                while True:
                    data = src.recv(65536)
                    if not data:
                        break
                    dst.sendall(data)
                    self.bytes += len(data)
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        """Reset every live connection (mid-stream, without a TLS close)."""
        with self.lock:
            conns, self.conns = self.conns, []
        for s in conns:
            with contextlib.suppress(OSError):  # already closed by its peer
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                s.close()
        self.cuts += 1

    def close(self) -> None:
        self.running = False
        self.listener.close()
        self.cut()

