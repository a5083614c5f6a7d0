"""Peer links over mutual TLS: one outgoing link per peer carries our frames, one accepted session per peer brings theirs.

The dialing side numbers every frame (link sequence), keeps it in a bounded retransmit buffer until the
accepting side acknowledges it, sends only within the credit the accepting side grants, serves lanes by
priority, and after a reconnect resends exactly what the other side did not receive. The accepting side
drops link-level duplicates and stops granting credit while its own workers are slow.
"""
from __future__ import annotations

import asyncio
import logging
import random
import ssl
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from nebula.config import PeerConfig, split_host_port
from nebula.wire import FrameType, Lane, WireError, encode_frame, relink
from switch_server.framestream import FrameStream
from switch_server.lanes import LaneQueues
from switch_server.shaper import TokenBucket, min_rate
from switch_server.tlstransport import open_connection

if TYPE_CHECKING:  # pragma: no cover
    from switch_server.server import SwitchServer

log = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT_S = 10.0
IDLE_TIMEOUT_S = 15.0  # a link with no frame (not even a PONG or ACK) for this long is considered dead
PING_EVERY_S = 1.0
WRITE_HIGH_WATER = 256 * 1024
# bulk frames written but not yet acknowledged are capped, so that socket buffers never hold more than this
# ahead of an activation that arrives later (higher lanes are not capped)
BULK_INFLIGHT_BYTES = 1024**2
SMALL_FRAME_BYTES = 64 * 1024  # bytes in the transport before we wait: keeps lane priorities meaningful


def write_frame(writer: FrameStream, head: bytes, payload: Any = b"") -> None:
    """Write one frame (head, then payload without copying it first)."""
    if payload:
        writer.writelines((head, payload))
    else:
        writer.write(head)


class OutboundLink:
    """Our frames towards one peer cluster: lanes, retransmit buffer, credit, shaper, reconnect with backoff."""

    def __init__(self, server: SwitchServer, peer: PeerConfig) -> None:
        self.server = server
        self.cluster = peer.cluster
        self.address = peer.address
        self.lanes = LaneQueues()
        self.rtx: deque[tuple[int, Lane, bytes, Any, int]] = deque()  # (link_seq, lane, head, payload, nbytes)
        self.rtx_bytes = 0
        self.next_seq = 1
        self.up = False
        self.down_since = time.time()
        self.peer_epoch = 0
        self.rtt_s: float | None = None
        self.wake = asyncio.Event()
        self.bucket = TokenBucket(None)
        self.set_limits()
        self.task: asyncio.Task | None = None
        self.stopping = False
        self.writer: FrameStream | None = None
        self.peer_serial: int | None = None
        self.sent_bytes = 0  # this session, for credit
        self.credit = 0
        self.bytes_out = 0  # since start, for status
        self.last_error = ""
        self.established = False

    def set_limits(self) -> None:
        """Apply link.shape and limits.peer_rate_mbit (also on hot reload)."""
        cfg = self.server.cfg
        self.bucket.set_rate(min_rate(cfg.link.shape.rate_mbit, cfg.limits.peer_rate_mbit))
        self.delay_s = cfg.link.shape.delay_ms / 1000.0

    def start(self) -> None:
        """Start dialing."""
        self.task = asyncio.create_task(self._run(), name=f"link-{self.cluster}")

    async def stop(self) -> None:
        """Stop the link (queued frames are dropped; senders retransmit end to end)."""
        self.stopping = True
        if self.task is not None:
            self.task.cancel()
            # (3.11's wait_for can swallow a cancellation; `stopping` ends the loop then, the timeout bounds it)
            await asyncio.wait({self.task}, timeout=2.0)
        self._close()

    def enqueue(self, lane: Lane, head: bytes, payload: Any) -> None:
        """Queue a frame for this peer."""
        n = len(head) + len(payload)
        self.lanes.push(lane, (head, payload), n)
        self.server.mem_used += n
        self.wake.set()

    def queued_bytes(self) -> int:
        """Bytes waiting in lanes plus unacknowledged bytes."""
        return self.lanes.bytes + self.rtx_bytes

    def drop_session(self, reason: str) -> None:
        """Close the current connection (e.g. the peer's certificate was revoked); it is dialed again later."""
        self.last_error = reason
        self._close()

    def _close(self) -> None:
        if self.writer is not None:
            self.writer.transport.abort()
            self.writer = None
        if self.up:
            self.up = False
            self.down_since = time.time()
            self.server.metrics.link_up.labels(peer=self.cluster).set(0)
            self.server.link_changed()

    async def _run(self) -> None:
        cfg = self.server.cfg.link
        backoff = cfg.reconnect_initial_s
        while not self.stopping:
            self.established = False
            try:
                await self._session()
            except asyncio.CancelledError:
                raise
            except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, ConnectionError) as exc:
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.info("link to %s down: %s", self.cluster, self.last_error)
            except WireError as exc:
                self.last_error = f"peer sent a malformed frame: {exc}"
                log.warning("link to %s: %s", self.cluster, self.last_error)
            except Exception:
                log.exception("link to %s failed", self.cluster)
            finally:
                self._close()
            if self.established:  # a cut after a working session is retried quickly
                backoff = cfg.reconnect_initial_s
            await asyncio.sleep(backoff * (0.5 + random.random() / 2))
            backoff = min(backoff * 2, cfg.reconnect_max_s)

    async def _session(self) -> bool:
        server = self.server
        host, port = split_host_port(self.address)
        writer = FrameStream(server.cfg.link.chunk_bytes)
        try:
            await open_connection(host, port, server.client_ctx, writer, HANDSHAKE_TIMEOUT_S)
            reader = writer
        except ssl.SSLError as exc:
            reason = server.tls_reason(exc)
            server.peer_rejected(self.cluster, self.address, reason, str(exc), outgoing=True)
            self.last_error = f"TLS handshake failed: {reason}"
            return False
        self.writer = writer
        ssl_obj = writer.get_extra_info("ssl_object")
        ident = server.check_switch(ssl_obj, self.cluster, self.address, outgoing=True)
        if ident is None:
            self.last_error = "peer certificate refused"
            return False
        self.peer_serial = server.serial_of(ssl_obj)
        write_frame(writer, encode_frame(FrameType.LINK_HELLO, {"cluster": server.cfg.cluster, "epoch": server.epoch}))
        frame, _, _ = await reader.read_frame(HANDSHAKE_TIMEOUT_S)
        if frame.type == FrameType.ERROR:
            self.last_error = f"peer refused us: {frame.meta['code']}: {frame.meta['message']}"
            log.warning("link to %s: %s", self.cluster, self.last_error)
            return False
        if frame.type != FrameType.LINK_WELCOME or frame.meta["cluster"] != self.cluster:
            raise WireError("bad_handshake", f"expected LINK_WELCOME from {self.cluster}, got {frame.type.name} {frame.meta}")
        resume = frame.meta["resume"]
        epoch_changed = self.peer_epoch not in (0, frame.meta["epoch"])
        self.peer_epoch = frame.meta["epoch"]
        self.credit = frame.meta["credit"]
        self.sent_bytes = 0
        # what the peer already holds needs no resend; it is dropped when the peer acknowledges it
        resend = deque(e for e in self.rtx if e[0] > resume)
        if resend:
            server.metrics.retransmits.labels(peer=self.cluster).inc(len(resend))
        self.up = True
        self.established = True
        server.metrics.link_up.labels(peer=self.cluster).set(1)
        log.info("link to %s up (peer epoch %d, resume after %d, resending %d frames)",
                 self.cluster, self.peer_epoch, resume, len(resend))
        server.link_changed(peer_restarted=epoch_changed)
        server.send_checkpoint(self)
        reader.dispatch(self._on_frame)
        reader_task = asyncio.create_task(reader.serve(IDLE_TIMEOUT_S))
        ping_task = asyncio.create_task(self._pinger(writer))
        try:
            await self._writer(writer, resend, reader_task)
        finally:
            reader_task.cancel()
            ping_task.cancel()
            await asyncio.gather(reader_task, ping_task, return_exceptions=True)
        return True

    async def _writer(self, writer: FrameStream, resend: deque, reader_task: asyncio.Task) -> None:
        server = self.server
        cap = server.cfg.link.retransmit_buffer_bytes
        # at least two chunks in flight, so the bulk lane never degrades to stop-and-wait
        bulk_cap = max(BULK_INFLIGHT_BYTES, 2 * server.cfg.link.chunk_bytes)
        delay_line: deque[tuple[float, bytes, Any]] = deque()
        wire_wake = asyncio.Event()
        wire_task = asyncio.create_task(self._wire(writer, delay_line, wire_wake)) if self.delay_s > 0 else None
        transport = writer.transport
        reader_task.add_done_callback(lambda _t: self.wake.set())
        batch: list[Any] = []  # small frames go out in one TLS write: one record and one syscall for many
        batch_bytes = 0
        burst = 0
        try:
            while not reader_task.done():
                if transport.is_closing():
                    raise ConnectionResetError("connection to the peer was lost")
                if resend:
                    seq, lane, head, payload, n = resend.popleft()
                elif (self.lanes and self.rtx_bytes < cap and self.sent_bytes < self.credit
                      and not (self.rtx_bytes >= bulk_cap and self.lanes.only_bulk())):
                    lane, (head, payload), n = self.lanes.pop()
                    server.mem_used -= n
                    seq = self.next_seq
                    self.next_seq += 1
                    head = relink(head, seq)
                    self.rtx.append((seq, lane, head, payload, n))
                    self.rtx_bytes += n
                    server.maybe_resume()
                else:
                    if batch:
                        writer.write(b"".join(batch))
                        batch, batch_bytes = [], 0
                    # a suspended coroutine's locals keep the last frame alive: drop it, so that a worker's
                    # shared-memory region goes back as soon as the peer has it (nebula.wire.shm)
                    head = payload = None
                    self.wake.clear()
                    await self.wake.wait()
                    continue
                self.sent_bytes += n
                self.bytes_out += n
                server.metrics.count(self.cluster, lane, "out", n)
                wait = self.bucket.take(n)
                if wait > 0:
                    if batch:
                        writer.write(b"".join(batch))
                        batch, batch_bytes = [], 0
                    await asyncio.sleep(wait)
                if wire_task is not None:
                    delay_line.append((time.monotonic() + self.delay_s, head, payload))
                    wire_wake.set()
                    if wire_task.done():
                        wire_task.result()
                    continue
                if n < SMALL_FRAME_BYTES:
                    batch.append(head)
                    if payload:
                        batch.append(payload)
                    batch_bytes += n
                    if batch_bytes < SMALL_FRAME_BYTES:
                        continue
                    writer.write(b"".join(batch))
                    batch, batch_bytes = [], 0
                else:
                    if batch:
                        writer.write(b"".join(batch))
                        batch, batch_bytes = [], 0
                    write_frame(writer, head, payload)
                burst += 1
                if transport.get_write_buffer_size() > WRITE_HIGH_WATER:
                    await writer.drain()
                elif burst >= 16:  # let acknowledgements and connection loss be seen between bursts
                    burst = 0
                    await asyncio.sleep(0)
            reader_task.result()  # raises what ended the reader
        finally:
            if wire_task is not None:
                wire_task.cancel()
                await asyncio.gather(wire_task, return_exceptions=True)

    async def _wire(self, writer: FrameStream, line: deque, wake: asyncio.Event) -> None:
        """Emulated propagation delay: each frame leaves `delay_ms` after it was scheduled."""
        while True:
            if not line:
                wake.clear()
                await wake.wait()
                continue
            due, head, payload = line[0]
            now = time.monotonic()
            if due > now:
                await asyncio.sleep(due - now)
            line.popleft()
            if writer.transport.is_closing():
                raise ConnectionResetError("connection to the peer was lost")
            write_frame(writer, head, payload)
            head = payload = None  # (see _writer)
            if writer.transport.get_write_buffer_size() > WRITE_HIGH_WATER:
                await writer.drain()

    async def _pinger(self, writer: FrameStream) -> None:
        while not writer.transport.is_closing():
            write_frame(writer, encode_frame(FrameType.PING, {"t": time.monotonic()}))
            await asyncio.sleep(PING_EVERY_S)

    def _on_frame(self, frame: Any, _head: bytes, _payload: Any) -> None:
        """A frame from the peer on our outgoing connection (called as it is parsed)."""
        server = self.server
        if self.writer is not None:
            self.writer.max_payload = server.cfg.link.chunk_bytes  # (hot reload may change it)
        t = frame.type
        if t == FrameType.LINK_ACK:
            acked = frame.header.link_seq
            while self.rtx and self.rtx[0][0] <= acked:
                self.rtx_bytes -= self.rtx.popleft()[4]
            self.credit = frame.meta["credit"]
            self.wake.set()
        elif t == FrameType.PONG:
            self.rtt_s = time.monotonic() - float(frame.meta["t"])
            server.metrics.rtt.labels(peer=self.cluster).set(self.rtt_s)
        elif t == FrameType.CHECKPOINT:
            server.receive_checkpoint(self.cluster, frame.meta["checkpoint"])
        elif t == FrameType.ERROR:
            log.warning("peer %s reports: %s: %s", self.cluster, frame.meta["code"], frame.meta["message"])
        else:
            raise WireError("bad_type", f"unexpected {t.name} frame on the outgoing link to {self.cluster}")


class InboundSession:
    """A peer's frames arriving on an accepted TLS connection: dedup, delivery, acknowledgements and credit."""

    def __init__(self, server: SwitchServer, cluster: str, stream: FrameStream, serial: int | None) -> None:
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
        stream.dispatch(self._on_frame)
        await stream.serve(IDLE_TIMEOUT_S)

    def _on_frame(self, frame: Any, head: bytes, payload: Any) -> None:
        """A frame of the peer's, called as it is parsed; an exception ends the session."""
        server, st = self.server, self.link_state
        t = frame.type
        if t in (FrameType.DATA, FrameType.ACK, FrameType.ERROR):
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
            err = server.route(frame, head, payload, origin=self, from_peer=self.cluster)
            if err is not None:
                self.release(n)
                server.refuse_remote(frame, err[0], err[1])
            self.schedule_ack()
        elif t == FrameType.PING:
            if self.writer.transport.is_closing():
                raise ConnectionResetError("connection to the peer was lost")
            write_frame(self.writer, encode_frame(FrameType.PONG, {"t": frame.meta["t"]}))
        elif t == FrameType.CHECKPOINT:
            server.receive_checkpoint(self.cluster, frame.meta["checkpoint"])
            server.send_checkpoint_to(self)
        else:
            raise WireError("bad_type", f"unexpected {t.name} frame on a session from {self.cluster}")
