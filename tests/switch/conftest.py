"""Shared fixtures for switch tests: a provisioned throwaway federation and helpers to run real switch processes."""
from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from security.provision import provision


class Switch:
    """A running `nebula-switch serve` process."""

    def __init__(self, proc, cluster: str, config: Path, wan: str, local: str, log: Path) -> None:
        self.proc, self.cluster, self.config, self.wan, self.local, self.log = proc, cluster, config, wan, local, log

    def kill9(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def hup(self) -> None:
        os.kill(self.proc.pid, signal.SIGHUP)

    def audit(self) -> list[dict]:
        path = self.config.parent / "audit.log"
        if not path.exists():
            return []
        # the switch may be writing a record right now: only lines it has finished (newline-terminated) count
        done = path.read_text().rpartition("\n")[0]
        return [json.loads(line) for line in done.splitlines() if line.strip()]


def wait_audit(switch: Switch, pred, timeout_s: float = 20.0) -> dict:
    """First audit record of `switch` matching `pred`, waiting for it to appear."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for rec in switch.audit():
            if pred(rec):
                return rec
        time.sleep(0.1)
    raise AssertionError(f"no matching audit record; have: {[ (r['action'], r.get('detail')) for r in switch.audit()]}")


def start_switch(procs, config: Path, timeout_s: float = 30.0, prefix: tuple[str, ...] = ()) -> Switch:
    """Start a switch server on `config` (behind `prefix`, e.g. `ip netns exec NS`) and wait for its
    `listening` line."""
    log = config.parent / "switch.stderr"
    proc = procs.start([*prefix, sys.executable, "-m", "switch_server.cli", "serve", "--config", str(config),
                        "--log-level", "info"], stderr=open(log, "ab"))
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if sel.select(0.2):
            line = proc.stdout.readline()
            if line.startswith("listening "):
                fields = dict(kv.split("=", 1) for kv in line.split()[1:])
                cluster = yaml.safe_load(config.read_text())["cluster"]
                return Switch(proc, cluster, config, fields["wan"], fields["local"], log)
            if not line:
                break
        if proc.poll() is not None:
            break
    raise AssertionError(f"switch {config} did not start: {log.read_text()[-3000:]}")


TEST_CHUNK_BYTES = 256 * 1024


def rss_bytes(pid: int) -> int:
    """Resident set size of process `pid` now."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def edit_yaml(path: Path, fn) -> None:
    """Load YAML `path`, let `fn` change the dict in place, write it back."""
    data = yaml.safe_load(path.read_text())
    fn(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


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

