"""Accepted peer sessions: a peer's frames arriving on its TLS connection, with dedup, routing, acknowledgements
and credit (the accepting side stops granting credit while its own workers are slow)."""
from __future__ import annotations

__all__ = ["InboundSession"]

import asyncio
import logging
from typing import Any

from nebula.wire import Dispatcher, FrameType, WireError, encode_frame
from switch_server.framestream import FrameStream, write_frame
from switch_server.host import LinkHost
from switch_server.link import IDLE_TIMEOUT_S

log = logging.getLogger(__name__)


class InboundSession:
    """A peer's frames arriving on an accepted TLS connection: dedup, delivery, acknowledgements and credit."""

    def __init__(self, server: LinkHost, cluster: str, stream: FrameStream, serial: int | None) -> None:
        self.server = server
        self.cluster = cluster
        self.writer = stream
        self.serial = serial
        self.window = server.link_window()
        self.received_bytes = 0  # this session
        self.held_bytes = 0  # bytes of this peer's frames not yet handed to our workers
        self.ack_scheduled = False
        self.closed = False
        self.bytes_in = 0
        self.link_state: dict[str, int] = {}  # this peer's inbound link state (epoch, last link sequence)
        self.on_frame = Dispatcher(f"a session from {cluster}", {
            FrameType.DATA: self._on_routed,
            FrameType.ACK: self._on_routed,
            FrameType.ERROR: self._on_routed,
            FrameType.PING: self._on_ping,
            FrameType.CHECKPOINT: self._on_checkpoint,
        })

    def credit(self) -> int:
        """Cumulative bytes the peer may send in this session."""
        return self.received_bytes + max(0, self.window - self.held_bytes)

    def release(self, nbytes: int) -> None:
        """`nbytes` of this peer's frames left our queues: grant more credit."""
        self.held_bytes -= nbytes
        self.schedule_ack()

    def schedule_ack(self) -> None:
        """Send one LINK_ACK soon (coalesces many frames into one acknowledgement)."""
        if not self.ack_scheduled and not self.closed:
            self.ack_scheduled = True
            asyncio.get_running_loop().call_soon(self._send_ack)

    def _send_ack(self) -> None:
        self.ack_scheduled = False
        if self.closed or self.writer.transport.is_closing():
            return
        st = self.server.link_in_state(self.cluster)
        write_frame(self.writer, encode_frame(FrameType.LINK_ACK, {"credit": self.credit()}, link_seq=st["last"]))

    def close(self, reason: str = "") -> None:
        """Abort the connection."""
        if not self.closed:
            self.closed = True
            self.writer.transport.abort()
            if reason:
                log.info("closed session from %s: %s", self.cluster, reason)

    async def run(self, epoch: int) -> None:
        """Serve the session after LINK_HELLO until the connection ends."""
        server = self.server
        st = server.link_in_state(self.cluster)
        if st["epoch"] != epoch:
            # a restarted peer numbers from 1 again; anything it still needs it resends end to end
            st["epoch"], st["last"] = epoch, 0
        write_frame(self.writer, encode_frame(FrameType.LINK_WELCOME, {
            "cluster": server.cfg.cluster, "epoch": server.epoch, "resume": st["last"], "credit": self.credit(),
        }))
        self.link_state = st
        stream = self.writer
        stream.max_payload = server.cfg.link.chunk_bytes
        stream.dispatch(self.on_frame)
        await stream.serve(IDLE_TIMEOUT_S)

    def _on_routed(self, frame: Any, head: bytes, payload: Any) -> None:
        """A DATA, ACK or ERROR frame of the peer's (called as it is parsed): dedup by link sequence, then route."""
        server, st = self.server, self.link_state
        seq = frame.header.link_seq
        n = len(head) + len(payload)
        if seq <= st["last"]:
            return  # already received before a reconnect
        if st["last"] and seq != st["last"] + 1:
            # (with no state, e.g. after our restart, the peer resends from its oldest unacknowledged frame)
            raise WireError("bad_sequence", f"link sequence jumped from {st['last']} to {seq}")
        st["last"] = seq
        self.received_bytes += n
        self.bytes_in += n
        server.metrics.count(self.cluster, frame.header.lane, "in", n)
        self.held_bytes += n
        refusal = server.policy.check(self.cluster, frame)
        if refusal is not None:
            self.release(n)
            self.refused(frame, *refusal)
            return
        err = server.route(frame, head, payload, origin=self, from_peer=self.cluster)
        if err is not None:
            self.release(n)
            server.refuse_remote(frame, err[0], err[1])
        self.schedule_ack()

    def refused(self, frame: Any, code: str, message: str) -> None:
        """Refuse one frame of this peer's (the session goes on): counted, audited (bounded), and told to the peer
        on this session, never to the cluster the frame names (it may be forged)."""
        server = self.server
        server.metrics.refused.labels(reason=code).inc()
        server.metrics.peer_refused.labels(peer=self.cluster, reason=code).inc()
        detail: dict[str, Any] = {"reason": code, "detail": message[:300], "type": frame.type.name}
        try:
            detail["channel"] = frame.key().to_meta() if frame.type != FrameType.ERROR else frame.meta.get("channel")
        except WireError:
            pass
        if server.audit_limited(("frame_refused", self.cluster, code), server.actor, "frame_refused", self.cluster,
                                "denied", detail):
            log.warning("refused a frame of peer %s: %s: %s", self.cluster, code, message)
            if not self.closed and not self.writer.transport.is_closing():
                write_frame(self.writer, encode_frame(FrameType.ERROR, {"code": code, "message": message[:1000]}))

    def _on_ping(self, frame: Any, _head: bytes, _payload: Any) -> None:
        if self.writer.transport.is_closing():
            raise ConnectionResetError("connection to the peer was lost")
        write_frame(self.writer, encode_frame(FrameType.PONG, {"t": frame.meta["t"]}))

    def _on_checkpoint(self, frame: Any, _head: bytes, _payload: Any) -> None:
        self.server.checkpoints.receive(self.cluster, frame.meta["checkpoint"])
        head = self.server.checkpoints.frame()  # answered with ours
        if head is not None and not self.closed:
            write_frame(self.writer, head)
