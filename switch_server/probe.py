"""`nebula-switch probe`: numbered messages through the federation, counted at the receiver (an iperf for links)."""
from __future__ import annotations

import struct
import time
from pathlib import Path

from nebula.channel import ChannelError, Endpoint

_HEAD = struct.Struct("!Qd")  # message index, send time
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
        futs = [ch.send([_HEAD.pack(i, time.time()), pad], lane="bulk" if size_bytes > 1 << 20 else "activation")
                for i in range(count)]
        for f in futs:
            try:
                f.result(timeout=timeout_s)
            except ChannelError as exc:
                raise ProbeError(f"message refused: {exc}") from None
        if not ep.flush(timeout_s):
            raise ProbeError(f"not every message was acknowledged within {timeout_s} s; is a receiver running?")
        dt = max(time.monotonic() - t0, 1e-9)
    finally:
        ep.close(flush_s=timeout_s)
    return {"sent": count, "bytes": count * size_bytes, "seconds": round(dt, 4),
            "mbit_s": round(count * size_bytes * 8 / dt / 1e6, 3)}


def probe_recv(config: str | Path, *, count: int, job: str = "probe", timeout_s: float = 60.0) -> dict:
    """Receive `count` probe messages from any peer cluster; report received, missing, duplicates, order, Mbit/s."""
    ep = _connect(config, job, timeout_s)
    seen: set[int] = set()
    received = duplicates = out_of_order = 0
    nbytes = 0
    last = -1
    latencies: list[float] = []
    t_first = t_last = None
    try:
        peers = ep.peer_clusters() or [ep.cluster]
        channels = [ep.channel(c, 0, PROBE_CHANNEL) for c in peers]
        deadline = time.monotonic() + timeout_s
        while received < count and time.monotonic() < deadline:
            for ch in channels:
                try:
                    parts = ch.recv_parts(timeout_s=0.05)
                except TimeoutError:
                    continue
                except ChannelError:
                    continue  # a peer link down: keep waiting for the others until the deadline
                now = time.time()
                head = bytes(parts[0][: _HEAD.size])
                i, sent = _HEAD.unpack(head)
                t_first = t_first or time.monotonic()
                t_last = time.monotonic()
                received += 1
                nbytes += sum(len(p) for p in parts)
                latencies.append(now - sent)
                if i in seen:
                    duplicates += 1
                seen.add(i)
                if i < last:
                    out_of_order += 1
                last = max(last, i)
                deadline = time.monotonic() + timeout_s
    finally:
        ep.close(flush_s=2.0)
    dt = (t_last - t_first) if t_first and t_last and t_last > t_first else None
    latencies.sort()
    return {
        "received": received,
        "missing": count - len(seen),
        "duplicates": duplicates,
        "out_of_order": out_of_order,
        "mbit_s": round(nbytes * 8 / dt / 1e6, 3) if dt else None,
        "latency_p50_ms": round(latencies[len(latencies) // 2] * 1000, 3) if latencies else None,
    }
