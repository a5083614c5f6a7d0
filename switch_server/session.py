"""Accepted peer sessions: a peer's frames arriving on its TLS connection, with dedup, routing, acknowledgements
and credit (the accepting side stops granting credit while its own workers are slow)."""
from __future__ import annotations

__all__ = ["InboundSession"]

import asyncio
import logging
import time
from typing import Any

from nebula.wire import HEADER_BYTES, MAX_META_BYTES, Dispatcher, FrameType, WireError, encode_frame
from nebula.wire.batch import table_refusal
from switch_server.framestream import FrameStream, write_frame
from switch_server.host import LinkHost
from switch_server.link import IDLE_TIMEOUT_S

log = logging.getLogger(__name__)

# control frames a peer may ask answers for: a behaving peer pings once a second and sends a checkpoint every 30 s
PINGS_PER_S = 20.0
PING_BURST = 40.0
CHECKPOINT_MIN_S = 1.0
# a peer whose unanswered control frames pass this many in one session is flooding, not probing: it is cut
MAX_IGNORED_CONTROL = 2000
# answers (PONG, LINK_ACK) are not written while this much waits unread in the connection: a peer that never reads
# cannot make us buffer without bound (acknowledgements are cumulative: a later one says it all)
CONTROL_BACKLOG_BYTES = 64 * 1024
# refusals by routing that only a broken or hostile peer draws: audited and told to the peer, never to the cluster
# the frame names
AUDITED_ROUTE_REFUSALS = frozenset({"ack_beyond_sent"})
# A frame of the peer's dropped here for a rank not connected (its account's pending budget is spent) gives its
# credit back at once, and the peer is told to hold that account's frames back (link.HOLD_S) so that the account
# does not spend the link's credit, which every account shares, on frames this switch cannot take. A peer that
# goes on sending them after it was told (more than twice its window within NOTICE_S) pays with its credit: those
# bytes come back only DROPPED_CREDIT_HOLD_S later, so it cannot stream at line rate into frames dropped here.
NOTICE_S = 2.0
DROPPED_CREDIT_HOLD_S = 10.0


class InboundSession:
    """A peer's frames arriving on an accepted TLS connection: dedup, delivery, acknowledgements and credit."""

    def __init__(self, server: LinkHost, cluster: str, stream: FrameStream, serial: int | None) -> None:
        self.server = server
        self.cluster = cluster
        self.writer = stream
        self.serial = serial
        self.not_after = 0.0  # when the peer's certificate expires (set once known): the session is cut then
        self.window = server.link_window()
        self.received_bytes = 0  # this session
        self.held_bytes = 0  # bytes of this peer's frames not yet handed to our workers
        self.ack_scheduled = False
        self.closed = False
        self.bytes_in = 0
        self.granted = 0  # the credit last told to the peer: it may not send beyond it (and one frame)
        self.slack = server.cfg.link.chunk_bytes + HEADER_BYTES + MAX_META_BYTES
        self.ping_tokens = PING_BURST
        self.ping_stamp = time.monotonic()
        self.last_checkpoint = -CHECKPOINT_MIN_S
        self.ignored_control = 0
        self.link_state: dict[str, int] = {}  # this peer's inbound link state (epoch, last link sequence)
        self.peer_epoch = 0  # the peer switch's boot epoch (LINK_HELLO): bounds the incarnations it may name
        self.notices: dict[str, list[float]] = {}  # account -> [when told to hold it back, bytes dropped since]
        self.on_frame = Dispatcher(f"a session from {cluster}", {
            FrameType.DATA: self._on_routed,
            FrameType.ACK: self._on_routed,
            FrameType.ERROR: self._on_routed,
            FrameType.PING: self._on_ping,
            FrameType.CHECKPOINT: self._on_checkpoint,
            FrameType.ENDED: self._on_routed,
        })

    def credit(self) -> int:
        """Cumulative bytes the peer may send in this session."""
        return self.received_bytes + max(0, self.window - self.held_bytes)

    def release(self, nbytes: int) -> None:
        """`nbytes` of this peer's frames left our queues: grant more credit."""
        self.held_bytes -= nbytes
        self.schedule_ack()

    def dropped(self, key: Any, nbytes: int) -> None:
        """Our switch dropped `nbytes` of the peer's for a rank of `key.account` that is not connected."""
        now = time.monotonic()
        st = self.notices.get(key.account)
        if st is None or now - st[0] > NOTICE_S:
            self.notices[key.account] = [now, 0]
            if not self.closed and not self.writer.transport.is_closing():
                write_frame(self.writer, encode_frame(FrameType.ERROR, {
                    "code": "account_held", "channel": key.to_meta(),
                    "message": f"account {key.account!r} has more held here for ranks not connected than "
                               f"limits.pending_bytes allows; hold its frames back a while"}))
            self.release(nbytes)
            return
        st[1] += nbytes
        if st[1] <= 2 * self.window:  # (what was in flight when the peer was told)
            self.release(nbytes)
            return
        asyncio.get_running_loop().call_later(DROPPED_CREDIT_HOLD_S, self.release, nbytes)
        server = self.server
        server.metrics.peer_refused.labels(peer=self.cluster, reason="hold_ignored").inc()
        server.audit_limited(("control_ignored", self.cluster, "hold_ignored"), server.actor, "control_ignored",
                             self.cluster, "denied", {"reason": "hold_ignored", "account": key.account,
                                                      "detail": "the peer goes on sending an account's frames after "
                                                                "it was told to hold them back: its credit pays"})

    def schedule_ack(self) -> None:
        """Send one LINK_ACK soon (coalesces many frames into one acknowledgement)."""
        if not self.ack_scheduled and not self.closed:
            self.ack_scheduled = True
            asyncio.get_running_loop().call_soon(self._send_ack)

    def _send_ack(self) -> None:
        self.ack_scheduled = False
        if self.closed or self.writer.transport.is_closing():
            return
        if self.writer.transport.get_write_buffer_size() > CONTROL_BACKLOG_BYTES:
            self.ack_scheduled = True  # the peer is not reading: acknowledge once it does
            asyncio.get_running_loop().call_later(0.05, self._send_ack)
            return
        st = self.server.link_in_state(self.cluster)
        credit = self.credit()
        self.granted = max(self.granted, credit)
        write_frame(self.writer, encode_frame(FrameType.LINK_ACK, {"credit": credit}, link_seq=st["last"]))

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
        self.peer_epoch = epoch
        if st["epoch"] != epoch:
            # a restarted peer numbers from 1 again; anything it still needs it resends end to end
            st["epoch"], st["last"] = epoch, 0
        self.granted = self.credit()
        write_frame(self.writer, encode_frame(FrameType.LINK_WELCOME, {
            "cluster": server.cfg.cluster, "epoch": server.epoch, "resume": st["last"], "credit": self.granted,
        }))
        self.link_state = st
        stream = self.writer
        stream.max_payload = server.cfg.link.chunk_bytes
        stream.placer = self._place
        stream.dispatch(self.on_frame)
        await stream.serve(IDLE_TIMEOUT_S)

    def _place(self, frame: Any, nbytes: int) -> memoryview | None:
        """Where TLS should decrypt a large DATA frame's payload (its head parsed, its payload still coming): the
        arena of the local worker it is for, so the payload is never copied here. Only a frame this peer may send
        there is placed: a refused one never touches a worker's memory."""
        try:
            if frame.type != FrameType.DATA or self.server.policy.check(self.cluster, frame, self.peer_epoch):
                return None
            return self.server.place(frame.key(), nbytes)
        except WireError:
            return None

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
        if self.received_bytes > self.granted + self.slack:
            # the peer ignores its credit: its frames would queue here without bound
            raise WireError("credit_exceeded", f"peer {self.cluster} sent {self.received_bytes} bytes in this session "
                            f"but was granted {self.granted}; a switch sends only within the credit of LINK_ACK")
        self.bytes_in += n
        server.metrics.count(self.cluster, frame.header.lane, "in", n)
        self.held_bytes += n
        # (the table of a batch is the one part of a payload a switch reads: a lie is refused where it enters)
        refusal = server.policy.check(self.cluster, frame, self.peer_epoch) or table_refusal(frame.meta, payload)
        if refusal is not None:
            self.release(n)
            self.refused(frame, *refusal)
            return
        if frame.type == FrameType.ENDED:
            self.release(n)
            server.peer_incarnation_ended(self.cluster, frame.meta)
            return
        err = server.route(frame, head, payload, origin=self, from_peer=self.cluster)
        if err is not None:
            self.release(n)
            if err[0] in AUDITED_ROUTE_REFUSALS:
                self.refused(frame, *err)
            else:
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
            if frame.type in (FrameType.DATA, FrameType.ACK):
                detail["channel"] = frame.key().to_meta()
            elif frame.type == FrameType.ERROR:
                detail["channel"] = frame.meta.get("channel")
        except WireError:
            pass
        if server.audit_limited(("frame_refused", self.cluster, code), server.actor, "frame_refused", self.cluster,
                                "denied", detail):
            log.warning("refused a frame of peer %s: %s: %s", self.cluster, code, message)
            if not self.closed and not self.writer.transport.is_closing():
                write_frame(self.writer, encode_frame(FrameType.ERROR, {"code": code, "message": message[:1000]}))

    def _on_ping(self, frame: Any, _head: bytes, _payload: Any) -> None:
        transport = self.writer.transport
        if transport.is_closing():
            raise ConnectionResetError("connection to the peer was lost")
        now = time.monotonic()
        self.ping_tokens = min(PING_BURST, self.ping_tokens + (now - self.ping_stamp) * PINGS_PER_S)
        self.ping_stamp = now
        if self.ping_tokens < 1 or transport.get_write_buffer_size() > CONTROL_BACKLOG_BYTES:
            self.ignored(frame, "ping_flood", f"more than {PINGS_PER_S:g} PINGs a second, or PONGs left unread")
            return
        self.ping_tokens -= 1
        write_frame(self.writer, encode_frame(FrameType.PONG, {"t": frame.meta["t"]}))

    def ignored(self, frame: Any, code: str, message: str) -> None:
        """A control frame of the peer's left unanswered (it asks too often): counted, audited (bounded)."""
        server = self.server
        server.metrics.peer_refused.labels(peer=self.cluster, reason=code).inc()
        server.audit_limited(("control_ignored", self.cluster, code), server.actor, "control_ignored", self.cluster,
                             "denied", {"reason": code, "type": frame.type.name, "detail": message})
        self.ignored_control += 1
        if self.ignored_control > MAX_IGNORED_CONTROL:
            raise WireError(code, f"peer {self.cluster} sent over {MAX_IGNORED_CONTROL} control frames too many: "
                            f"{message}; its session is closed")

    def _on_checkpoint(self, frame: Any, _head: bytes, _payload: Any) -> None:
        now = time.monotonic()
        if now - self.last_checkpoint < CHECKPOINT_MIN_S or self.writer.transport.get_write_buffer_size() > CONTROL_BACKLOG_BYTES:
            self.ignored(frame, "checkpoint_flood", f"more than one CHECKPOINT per {CHECKPOINT_MIN_S:g} s")
            return
        self.last_checkpoint = now
        self.server.checkpoints.receive(self.cluster, frame.meta["checkpoint"])
        head = self.server.checkpoints.frame()  # answered with ours
        if head is not None and not self.closed:
            write_frame(self.writer, head)
