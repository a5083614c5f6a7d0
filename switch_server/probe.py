"""`nebula-switch probe`: numbered messages through the federation, counted at the receiver (an iperf for links).

The receiver answers each sender, once it has taken all of that sender's messages, with a receipt (what it took,
and over how long); the sender reports the rate of what the receiving application took, from its first send to
that receipt, not how fast its own endpoint queued (a receiving process holds up to its window unread).
"""
from __future__ import annotations

__all__ = ["PROBE_CHANNEL", "ProbeError", "cert_refusals", "every_peer_refuses", "probe_recv", "probe_send",
           "receipt", "unreached", "worker_file"]

import json
import struct
import time
from pathlib import Path
from typing import Any

from nebula.channel import ChannelError, Endpoint

_HEAD = struct.Struct("!QdQ")  # message index, send time, how many messages this sender sends
PROBE_CHANNEL = "probe"
STATUS_FRESH_S = 10.0  # a status file older than this is not the running switch's (it writes one every second)
# how a link's last error says that the peer refuses this switch's certificate (`switch_server.peers`)
REFUSED_MARK = "refuses this switch's certificate"


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


def cert_refusals(status: dict[str, Any]) -> dict[str, str]:
    """Peers whose link is down because they refuse this switch's certificate, from its status: how each
    refuses it, in a few words."""
    out = {}
    for cluster, link in (status.get("links") or {}).items():
        err = str(link.get("last_error") or "")
        if link.get("up") or REFUSED_MARK not in err:
            continue
        if "peers list has no cluster" in err:
            out[cluster] = f"{cluster} has no cluster {status.get('cluster', '?')} in its peers list"
        else:
            how = err.partition(REFUSED_MARK)[2].partition(":")[0].strip()
            out[cluster] = f"{cluster} refuses it {how}".rstrip()
    return out


def every_peer_refuses(status: dict[str, Any]) -> bool:
    """Whether every peer of the switch refuses its certificate (revoked, or not in their peers lists)."""
    links = status.get("links") or {}
    return bool(links) and len(cert_refusals(status)) == len(links)


def unreached(status: dict[str, Any], to: str | None) -> str | None:
    """Why cluster `to` (None: any peer) cannot be reached, from this switch's status (None if its link is up or
    not known): every peer refusing this switch's certificate is said as such, with the fix."""
    links = status.get("links") or {}
    refused = cert_refusals(status)
    me = status.get("cluster", "?")
    if every_peer_refuses(status):
        fixes = []
        if any("peers list" not in why for why in refused.values()):
            fixes.append("if this cluster is still in the federation, get the current CRL (and a new kit if it was "
                         "revoked) from the federation's admin")
        if any("peers list" in why for why in refused.values()):
            fixes.append(f"a peer without {me} in its peers list must apply the admin's update that adds {me} "
                         "(`nebula-switch reload --update`)")
        return (f"every peer refused this switch's certificate (revoked or not in their peers list): "
                f"{'; '.join(refused[c] for c in sorted(refused))}; {'; '.join(fixes)} (this switch's log says "
                "more)")
    link = links.get(to) if to is not None else None
    if link is None or link.get("up"):
        return None
    return f"the link of switch {me} to {to} is down: {link.get('last_error') or 'not up yet'}"


def _status(config: str | Path) -> dict[str, Any] | None:
    """The status the running switch of `config` (its switch.yaml, or the one beside a worker.yaml) wrote lately;
    None if there is none to read here (a worker on another host)."""
    from nebula.config import ConfigError, load_switch_config
    from switch_server.status import status_path

    config = Path(config)
    path = config if config.name == "switch.yaml" else config.parent / "switch.yaml"
    try:
        st = json.loads(status_path(load_switch_config(path)).read_text())
    except (OSError, ValueError, ConfigError):
        return None
    if not isinstance(st, dict) or time.time() - float(st.get("time", 0)) > STATUS_FRESH_S:
        return None
    return st


def _why(config: str | Path, to: str) -> str | None:
    """Why `to` was not reached, as the switch of `config` knows it (None: it does not know, or the link is up)."""
    st = _status(config)
    return None if st is None else unreached(st, to)


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
        st = _status(config)
        if st is not None and every_peer_refuses(st):
            raise ProbeError(unreached(st, to))  # (so until an admin acts: waiting out the timeout tells nothing)
        ch = ep.channel(to, 0, PROBE_CHANNEL)
        pad = bytes(size_bytes - _HEAD.size)
        t0 = time.monotonic()
        futs = [ch.send([_HEAD.pack(i, time.time(), count), pad],
                        lane="bulk" if size_bytes > 1 << 20 else "activation") for i in range(count)]
        for f in futs:
            try:
                f.result(timeout=timeout_s)
            except ChannelError as exc:
                raise ProbeError(_why(config, to) or f"message refused: {exc}") from None
        if not ep.flush(timeout_s):
            raise ProbeError(_why(config, to) or f"not every message was acknowledged within {timeout_s} s; is a "
                             "receiver running?")
        try:
            got = json.loads(ch.recv(timeout_s=timeout_s))
        except (TimeoutError, ChannelError, ValueError):
            raise ProbeError(_why(config, to) or f"the receiver in cluster {to} sent no receipt within {timeout_s} "
                             "s; is it a `nebula-switch probe --recv` of this version?") from None
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
    st = _status(config)
    if st is not None and every_peer_refuses(st):
        ep.close(flush_s=0)
        raise ProbeError(unreached(st, None))
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
    if not sources:
        st = _status(config)
        if st is not None and every_peer_refuses(st):
            raise ProbeError(unreached(st, None))
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
