"""The receiving end of a measured path in a process of its own, as at a real site: there the sending and the
receiving program never share an interpreter, and in one process Nebula's two endpoints (each an I/O thread and an
application thread, all Python) would contend for one interpreter lock that no deployment has them share. Every
path `benchmarks/relay.py --vs-tunnels` compares gets the same treatment.

`RemoteReceiver(kind, ...)` starts the process (spawned, so no thread of this one is copied into it):

- `"nebula"`: a worker of cluster B (`Endpoint.connect(worker_yaml)`) reading the channel from A;
- `"tcp"`: a listener on loopback (`port`) taking one connection of length-prefixed messages (behind a relay);
- `"tls"`: the same, with mutual TLS from the given ca, cert, key and crl files (the raw TLS stream).

`expect(n)` tells it to read `n` messages; `finished()` returns when it read the last one, by the system's monotonic
clock (`time.perf_counter` is CLOCK_MONOTONIC on Linux, one clock for every process), and `arrivals()` the time
of each, one by one (`arrival()`: one-way latency of messages sent one at a time).
"""
from __future__ import annotations

import multiprocessing
import os
import queue
import socket
import time
from types import SimpleNamespace
from typing import Callable

__all__ = ["KINDS", "RemoteReceiver"]

KINDS = ("nebula", "tcp", "tls")


def _open(kind: str, spec: dict, results) -> tuple[object, Callable[[], None]]:
    """The receiving end of `kind`, and what closes it."""
    if kind == "nebula":
        from nebula.channel import Endpoint

        ep = Endpoint.connect(spec["worker_yaml"], job=spec["job"], rank=spec["rank"])
        ch = ep.channel(spec["peer"], spec["rank"], spec["name"])
        results.put(None)
        return SimpleNamespace(recv=lambda: ch.recv(timeout_s=120)), lambda: ep.close(flush_s=0)
    lst = socket.create_server(("127.0.0.1", 0))
    results.put(lst.getsockname()[1])
    lst.settimeout(60)
    conn, _ = lst.accept()
    lst.close()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if kind == "tls":
        from security.tls import server_context

        conn = server_context(spec["ca"], spec["cert"], spec["key"], spec["crl"]).wrap_socket(conn, server_side=True)
    from _tunnels import Framed  # (a spawned process gets the sys.path of the script that started it)

    reader = Framed()
    reader.rx = conn
    return reader, conn.close


def _next_job(commands, parent: int) -> tuple[int, bool] | None:
    """The next command; None to stop, also once the benchmark is gone (killed, it could not say so)."""
    while True:
        try:
            return commands.get(timeout=1.0)
        except queue.Empty:
            if os.getppid() != parent:
                return None


def _serve(kind: str, spec: dict, commands, results) -> None:
    parent = os.getppid()
    end, close = _open(kind, spec, results)
    try:
        while (job := _next_job(commands, parent)) is not None:
            n, each = job
            for _ in range(n):
                end.recv()
                if each:
                    results.put(time.perf_counter())
            if not each:
                results.put(time.perf_counter())
    finally:
        close()


class RemoteReceiver:
    """One receiving process; `pid` is its process id (its CPU is the path's), `port` where a tcp or tls receiver
    listens."""

    def __init__(self, kind: str, **spec: object) -> None:
        if kind not in KINDS:  # (before a process is spawned, not after a listener waited for a connection)
            raise ValueError(f"unknown receiver kind {kind!r}; use one of {', '.join(KINDS)}")
        ctx = multiprocessing.get_context("spawn")
        self._commands, self._results = ctx.Queue(), ctx.Queue()
        self._proc = ctx.Process(target=_serve, args=(kind, spec, self._commands, self._results), daemon=True,
                                 name=f"receiver-{kind}")
        self._proc.start()
        self.pid = self._proc.pid
        self.port = self._result(120)

    def _result(self, timeout_s: float) -> object:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return self._results.get(timeout=min(1.0, max(0.01, deadline - time.monotonic())))
            except queue.Empty:  # is the receiver still there?
                if not self._proc.is_alive():
                    raise RuntimeError(f"the receiving process exited with {self._proc.exitcode}") from None
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"the receiving process said nothing within {timeout_s:.0f} s") from None

    def expect(self, n: int, each: bool = False) -> None:
        """Read the next `n` messages; with `each`, report every arrival (`arrival`), else only the last."""
        self._commands.put((n, each))

    def finished(self, timeout_s: float = 300) -> float:
        """When the last of the messages `expect` announced arrived."""
        return self._result(timeout_s)

    def arrival(self, timeout_s: float = 300) -> float:
        """When the next message arrived (after `expect(n, each=True)`)."""
        return self._result(timeout_s)

    def close(self) -> None:
        if self._proc.is_alive():
            self._commands.put(None)
            self._proc.join(15)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5)
