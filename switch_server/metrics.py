"""Prometheus metrics of one switch server (own registry, so several servers can live in one process)."""
from __future__ import annotations

__all__ = ["SwitchMetrics"]

from typing import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server
from prometheus_client.core import CounterMetricFamily

from nebula.wire import LANES


class SwitchMetrics:
    """Bytes/frames per peer and lane, queue depth, RTT, retransmits, handshake failures, certificate expiry."""

    def __init__(self) -> None:
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
        self.route_refused = Counter("nebula_switch_route_refused_frames",
                                     "Frames of local workers to a cluster their account holds no route grant for",
                                     ["account", "cluster"], registry=r)
        self.link_up = Gauge("nebula_switch_link_up", "1 while the outgoing link to a peer is established", ["peer"], registry=r)
        self.cert_expiry = Gauge("nebula_switch_certificate_expiry_seconds", "Seconds until this switch's certificate expires", registry=r)
        self.workers = Gauge("nebula_switch_workers", "Workers registered on the local side", registry=r)

    def count(self, peer: str, lane: int, direction: str, nbytes: int) -> None:
        """Count one frame of `nbytes` on (peer, lane, direction)."""
        t = self._tally.get((peer, lane, direction))
        if t is None:
            t = self._tally[(peer, lane, direction)] = [0, 0]
        t[0] += nbytes
        t[1] += 1

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
