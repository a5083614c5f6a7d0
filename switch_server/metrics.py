"""Prometheus metrics of one switch server (own registry, so several servers can live in one process)."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from nebula.wire import LANES


class SwitchMetrics:
    """Bytes/frames per peer and lane, queue depth, RTT, retransmits, handshake failures, certificate expiry."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.bytes = Counter("nebula_switch_bytes", "Bytes relayed", ["peer", "lane", "direction"], registry=r)
        self.frames = Counter("nebula_switch_frames", "Frames relayed", ["peer", "lane", "direction"], registry=r)
        self.queue_bytes = Gauge("nebula_switch_queue_bytes", "Bytes queued towards a peer or the local side", ["peer"], registry=r)
        self.rtt = Gauge("nebula_switch_rtt_seconds", "Round-trip time to a peer switch", ["peer"], registry=r)
        self.retransmits = Counter("nebula_switch_retransmits", "Frames sent again after a reconnect", ["peer"], registry=r)
        self.handshake_failures = Counter(
            "nebula_switch_handshake_failures", "Refused TLS peers by reason", ["reason"], registry=r
        )
        self.refused = Counter("nebula_switch_refused_frames", "Frames refused by reason", ["reason"], registry=r)
        self.link_up = Gauge("nebula_switch_link_up", "1 while the outgoing link to a peer is established", ["peer"], registry=r)
        self.cert_expiry = Gauge("nebula_switch_certificate_expiry_seconds", "Seconds until this switch's certificate expires", registry=r)
        self.workers = Gauge("nebula_switch_workers", "Workers registered on the local side", registry=r)
        self._children: dict[tuple, tuple] = {}

    def count(self, peer: str, lane: int, direction: str, nbytes: int) -> None:
        """Count one frame of `nbytes` on (peer, lane, direction)."""
        key = (peer, lane, direction)
        ch = self._children.get(key)
        if ch is None:
            labels = dict(peer=peer, lane=LANES[lane], direction=direction)
            ch = self._children[key] = (self.bytes.labels(**labels), self.frames.labels(**labels))
        ch[0].inc(nbytes)
        ch[1].inc()

    def serve(self, host: str, port: int) -> tuple[str, int]:
        """Start the HTTP endpoint; return the bound address."""
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        return server.server_address[0], server.server_address[1]
