"""Prometheus metrics of one switch server (own registry, so several servers can live in one process).

The endpoint has no authentication: whoever can connect to it reads it. It listens on loopback by default (a
non-loopback `metrics.listen` needs `metrics.public: true`), and accounts appear in its labels as opaque ids
(`AccountIds`: stable across restarts, mapped to names in the state directory's METRIC_ACCOUNTS_FILE, which only
the switch's user reads) unless `metrics.account_names: true`. Peer clusters are named: every peer knows them.
"""
from __future__ import annotations

__all__ = ["AccountIds", "METRIC_ACCOUNTS_FILE", "SwitchMetrics"]

import hashlib
import hmac
import json
import secrets
import threading
from pathlib import Path
from typing import Any, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server
from prometheus_client.core import CounterMetricFamily

from nebula.wire import LANES
from security import atomic_write

METRIC_ACCOUNTS_FILE = "metric_accounts.json"  # {opaque id: account name}, 0600, in the switch's state directory
_SALT_FILE = "metric_accounts.salt"


class AccountIds:
    """Opaque, stable label values for account names: `acct-` and 12 hex digits of an HMAC under a salt kept in
    `state_dir` (0600), so the metrics tell accounts apart without naming them; the admin maps them back with
    METRIC_ACCOUNTS_FILE beside it."""

    def __init__(self, state_dir: str | Path) -> None:
        self.dir = Path(state_dir)
        self._salt: bytes | None = None
        self._ids: dict[str, str] = {}  # name -> id
        self._lock = threading.Lock()

    def _key(self) -> bytes:
        if self._salt is None:
            path = self.dir / _SALT_FILE
            try:
                self._salt = bytes.fromhex(path.read_text().strip())
            except (OSError, ValueError):
                self._salt = secrets.token_bytes(32)
                atomic_write(path, self._salt.hex().encode())
        return self._salt

    def __call__(self, account: str) -> str:
        """The label value of `account` (written to METRIC_ACCOUNTS_FILE the first time it is seen)."""
        got = self._ids.get(account)
        if got is not None:
            return got
        with self._lock:
            got = "acct-" + hmac.new(self._key(), account.encode(), hashlib.sha256).hexdigest()[:12]
            self._ids[account] = got
            path = self.dir / METRIC_ACCOUNTS_FILE
            try:
                known = json.loads(path.read_text()) if path.exists() else {}
            except (OSError, ValueError):
                known = {}
            known.update({v: k for k, v in self._ids.items()})
            atomic_write(path, json.dumps(known, indent=1, sort_keys=True).encode())
        return got


class _AccountLabels:
    """A labelled metric whose `account` label value goes through `ids` (a callable) first."""

    def __init__(self, metric: Any, ids: AccountIds | None) -> None:
        self.metric, self.ids = metric, ids

    def labels(self, **labels: str) -> Any:
        if self.ids is not None and "account" in labels:
            labels["account"] = self.ids(labels["account"])
        return self.metric.labels(**labels)


class SwitchMetrics:
    """Bytes/frames per peer and lane, queue depth, RTT, retransmits, handshake failures, certificate expiry."""

    def __init__(self, account_ids: AccountIds | None = None) -> None:
        """`account_ids`: how accounts are named in labels (None: by their names, `metrics.account_names`)."""
        r = self.registry = CollectorRegistry()
        # per-frame counts are plain integers read at scrape time: a labelled Counter takes a lock on every frame
        self._tally: dict[tuple[str, int, str], list[int]] = {}  # (peer, lane, direction) -> [bytes, frames]
        # local payload bytes that went through shared memory, not the socket; "placed": those of "out" that TLS
        # decrypted straight into the worker's arena, never copied in the switch
        self.shm_bytes = {"in": 0, "out": 0, "placed": 0}
        # payload bytes workers put into their connections' slots, and those frames took from them instead of the
        # socket (`nebula.wire.share`)
        self.slot_bytes = {"put": 0, "used": 0}
        r.register(_TallyCollector(self._tally, self.shm_bytes, self.slot_bytes))
        self.queue_bytes = Gauge("nebula_switch_queue_bytes", "Bytes queued towards a peer or the local side", ["peer"], registry=r)
        self.rtt = Gauge("nebula_switch_rtt_seconds", "Round-trip time to a peer switch", ["peer"], registry=r)
        self.retransmits = Counter("nebula_switch_retransmits", "Frames sent again after a reconnect", ["peer"], registry=r)
        self.handshake_failures = Counter(
            "nebula_switch_handshake_failures", "Refused TLS peers by reason", ["reason"], registry=r
        )
        self.refused = Counter("nebula_switch_refused_frames", "Frames refused by reason", ["reason"], registry=r)
        self.peer_refused = Counter("nebula_switch_peer_refused_frames",
                                    "Frames of a peer session refused: another source, an unreachable account or job, "
                                    "a budget", ["peer", "reason"], registry=r)
        self.route_refused = _AccountLabels(Counter(
            "nebula_switch_route_refused_frames", "Frames of local workers to a cluster their account (an opaque id "
            "unless metrics.account_names) holds no route grant for", ["account", "cluster"], registry=r), account_ids)
        self.link_up = Gauge("nebula_switch_link_up", "1 while the outgoing link to a peer is established", ["peer"], registry=r)
        self.cert_expiry = Gauge("nebula_switch_certificate_expiry_seconds", "Seconds until this switch's certificate expires", registry=r)
        self.expiry = Gauge("nebula_switch_expiry_seconds", "Seconds until this switch's certificate, the "
                            "federation's CA or the CRL's next update expires (negative: expired)", ["what"],
                            registry=r)
        self.workers = Gauge("nebula_switch_workers", "Workers registered on the local side", registry=r)

    def count(self, peer: str, lane: int, direction: str, nbytes: int) -> None:
        """Count one frame of `nbytes` on (peer, lane, direction)."""
        t = self._tally.get((peer, lane, direction))
        if t is None:
            t = self._tally[(peer, lane, direction)] = [0, 0]
        t[0] += nbytes
        t[1] += 1

    def totals(self) -> dict[str, dict[str, int]]:
        """Per peer, what was counted since the start, over every lane: bytes and frames, out and in."""
        out: dict[str, dict[str, int]] = {}
        for (peer, _lane, direction), (nbytes, frames) in list(self._tally.items()):
            t = out.setdefault(peer, {"bytes_out": 0, "frames_out": 0, "bytes_in": 0, "frames_in": 0})
            t[f"bytes_{direction}"] += nbytes
            t[f"frames_{direction}"] += frames
        return out

    def serve(self, host: str, port: int) -> tuple[str, int]:
        """Start the HTTP endpoint; return the bound address."""
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        return server.server_address[0], server.server_address[1]


class _TallyCollector:
    """Exposes SwitchMetrics' tallies as the counters nebula_switch_bytes, nebula_switch_frames,
    nebula_switch_shared_memory_bytes, nebula_switch_shared_memory_placed_bytes and nebula_switch_slot_bytes."""

    def __init__(self, tally: dict, shm: dict, slots: dict) -> None:
        self.tally = tally
        self.shm = shm
        self.slots = slots

    def collect(self) -> Iterator[CounterMetricFamily]:
        labels = ["peer", "lane", "direction"]
        nbytes = CounterMetricFamily("nebula_switch_bytes", "Bytes relayed", labels=labels)
        frames = CounterMetricFamily("nebula_switch_frames", "Frames relayed", labels=labels)
        for (peer, lane, direction), (b, f) in list(self.tally.items()):  # (one C call: safe against inserts)
            nbytes.add_metric([peer, LANES[lane], direction], b)
            frames.add_metric([peer, LANES[lane], direction], f)
        yield nbytes
        yield frames
        shm = CounterMetricFamily("nebula_switch_shared_memory_bytes",
                                  "Local payload bytes carried through workers' shared-memory arenas", labels=["direction"])
        for direction in ("in", "out"):
            shm.add_metric([direction], self.shm[direction])
        yield shm
        placed = CounterMetricFamily("nebula_switch_shared_memory_placed_bytes",
                                     "Of the bytes out, those a peer link decrypted straight into the worker's arena")
        placed.add_metric([], self.shm["placed"])
        yield placed
        slots = CounterMetricFamily("nebula_switch_slot_bytes", "Workers' payload bytes put into their connections' "
                                    "slots, and those frames took from there", labels=["op"])
        for op in ("put", "used"):
            slots.add_metric([op], self.slots[op])
        yield slots
