"""`nebula-switch probe`: numbered messages through the federation, counted at the receiver (an iperf for links).

The receiver answers each sender, once it has taken all of that sender's messages, with a receipt (what it took,
and over how long); the sender reports the rate of what the receiving application took, from its first send to
that receipt, not how fast its own endpoint queued (a receiving process holds up to its window unread).
"""
from __future__ import annotations

__all__ = ["PROBE_CHANNEL", "ProbeError", "probe_recv", "probe_send", "receipt", "worker_file"]

import json
import struct
import time
from pathlib import Path

from nebula.channel import ChannelError, Endpoint

_HEAD = struct.Struct("!QdQ")  # message index, send time, how many messages this sender sends
PROBE_CHANNEL = "probe"


class ProbeError(Exception):
    """The probe could not run (no worker file, switch unreachable, ...)."""


def worker_file(config: str | Path) -> Path:
    """The worker.yaml to use: `config` itself if it is one, else the worker.yaml beside a switch.yaml."""
    config = Path(config)
    if config.name == "switch.yaml" or not config.exists():
        candidate = config.parent / "worker.yaml"
        if not candidate.exists():
            raise ProbeError(f"no worker.yaml beside {config}; pass --worker FILE")
        return candidate
    return config


def _connect(config: str | Path, job: str, timeout_s: float) -> Endpoint:
    try:
        return Endpoint.connect(worker_file(config), job=job, rank=0, timeout_s=min(timeout_s, 30.0))
    except ChannelError as exc:
        raise ProbeError(str(exc)) from None


def probe_send(config: str | Path, *, to: str, count: int, size_bytes: int, job: str = "probe",
               timeout_s: float = 60.0) -> dict:
    """Send `count` messages of `size_bytes` to rank 0 of `job` in cluster `to`; wait until all are acknowledged."""
    if size_bytes < _HEAD.size:
        raise ProbeError(f"--bytes {size_bytes} is too small; use at least {_HEAD.size}")
    ep = _connect(config, job, timeout_s)
    try:
        ch = ep.channel(to, 0, PROBE_CHANNEL)
        pad = bytes(size_bytes - _HEAD.size)
        t0 = time.monotonic()
        futs = [ch.send([_HEAD.pack(i, time.time(), count), pad],
                        lane="bulk" if size_bytes > 1 << 20 else "activation") for i in range(count)]
        for f in futs:
            try:
                f.result(timeout=timeout_s)
            except ChannelError as exc:
                raise ProbeError(f"message refused: {exc}") from None
        if not ep.flush(timeout_s):
            raise ProbeError(f"not every message was acknowledged within {timeout_s} s; is a receiver running?")
        try:
            got = json.loads(ch.recv(timeout_s=timeout_s))
        except (TimeoutError, ChannelError, ValueError):
            raise ProbeError(f"the receiver in cluster {to} sent no receipt within {timeout_s} s; is it a "
                             "`nebula-switch probe --recv` of this version?") from None
        dt = max(time.monotonic() - t0, 1e-9)
    finally:
        ep.close(flush_s=timeout_s)
    taken = int(got.get("received", 0)) * size_bytes
    return {"sent": count, "received": got.get("received"), "missing": got.get("missing"),
            "bytes": taken, "seconds": round(dt, 4), "mbit_s": round(taken * 8 / dt / 1e6, 3),
            "receiver_mbit_s": got.get("mbit_s")}


def receipt(src: "_Source", nbytes: int, first: float, last: float) -> bytes:
    """What a receiver tells a sender once it took all of its messages: counts and its own rate."""
    span = last - first
    return json.dumps({**src.report(), "bytes": nbytes,
                       "mbit_s": round(nbytes * 8 / span / 1e6, 3) if span > 0 else None}).encode()


class _Source:
    """What one sender's probe messages did at the receiver: indexes seen, duplicates, order."""

    __slots__ = ("seen", "received", "duplicates", "out_of_order", "last", "expected", "nbytes", "first",
                 "answered")

    def __init__(self, expected: int = 0) -> None:
        self.seen: set[int] = set()
        self.received = self.duplicates = self.out_of_order = 0
        self.last = -1
        self.expected = expected  # messages its sender says it sends
        self.nbytes = 0
        self.first = time.monotonic()
        self.answered = False

    def add(self, i: int) -> None:
        self.received += 1
        if i in self.seen:
            self.duplicates += 1
        self.seen.add(i)
        if i < self.last:
            self.out_of_order += 1
        self.last = max(self.last, i)

    def report(self) -> dict:
        """Counts of this sender; `missing` are indexes below its highest one that never came."""
        return {"received": self.received, "missing": self.last + 1 - len(self.seen), "duplicates": self.duplicates,
                "out_of_order": self.out_of_order}


def probe_recv(config: str | Path, *, count: int, job: str = "probe", timeout_s: float = 60.0) -> dict:
    """Receive `count` probe messages in all from the peer clusters' senders; report received, missing, duplicates
    and order in total and per sender ("cluster/rank": each numbers its messages from 0), Mbit/s and latency."""
    ep = _connect(config, job, timeout_s)
    sources: dict[str, _Source] = {}
    nbytes = 0
    latencies: list[float] = []
    t_first = t_last = None
    try:
        peers = ep.peer_clusters() or [ep.cluster]
        channels = [(f"{c}/0", ep.channel(c, 0, PROBE_CHANNEL)) for c in peers]
        deadline = time.monotonic() + timeout_s
        while sum(len(s.seen) for s in sources.values()) < count and time.monotonic() < deadline:
            for name, ch in channels:
                try:
                    parts = ch.recv_parts(timeout_s=0.05)
                except TimeoutError:
                    continue
                except ChannelError:
                    continue  # a peer link down: keep waiting for the others until the deadline
                now = time.time()
                i, sent, expected = _HEAD.unpack(bytes(parts[0][: _HEAD.size]))
                t_first = t_first or time.monotonic()
                t_last = time.monotonic()
                size = sum(len(p) for p in parts)
                nbytes += size
                latencies.append(now - sent)
                src = sources.get(name)
                if src is None:
                    src = sources[name] = _Source(expected)
                src.add(i)
                src.nbytes += size
                if len(src.seen) >= src.expected and not src.answered:
                    src.answered = True
                    ch.send(receipt(src, src.nbytes, src.first, t_last))
                deadline = time.monotonic() + timeout_s
    finally:
        ep.close(flush_s=2.0)
    dt = (t_last - t_first) if t_first and t_last and t_last > t_first else None
    latencies.sort()
    per_peer = {name: src.report() for name, src in sorted(sources.items())}
    return {
        "received": sum(s.received for s in sources.values()),
        "missing": max(0, count - sum(len(s.seen) for s in sources.values())),
        "duplicates": sum(s.duplicates for s in sources.values()),
        "out_of_order": sum(s.out_of_order for s in sources.values()),
        "mbit_s": round(nbytes * 8 / dt / 1e6, 3) if dt else None,
        "latency_p50_ms": round(latencies[len(latencies) // 2] * 1000, 3) if latencies else None,
        "peers": per_peer,
    }
