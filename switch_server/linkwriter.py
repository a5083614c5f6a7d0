"""The writing half of an outgoing peer link's session (`switch_server.link`): lanes by priority onto the TLS
connection, within the peer's credit."""
from __future__ import annotations

__all__ = ["BULK_INFLIGHT_BYTES", "SMALL_FRAME_BYTES", "WRITE_HIGH_WATER", "write_loop", "write_through"]

import asyncio
import time
from collections import deque
from typing import Any, NamedTuple

from nebula.wire import Lane, relink
from switch_server.framestream import FrameStream, write_frame

WRITE_HIGH_WATER = 256 * 1024
# bulk frames written but not yet acknowledged are capped, so that socket buffers never hold more than this
# ahead of an activation that arrives later (higher lanes are not capped)
BULK_INFLIGHT_BYTES = 1024**2
SMALL_FRAME_BYTES = 64 * 1024  # bytes in the transport before we wait: keeps lane priorities meaningful


class Unacked(NamedTuple):
    """A frame sent on a link and kept until the peer acknowledges its link sequence number."""

    link_seq: int
    lane: Lane
    head: bytes
    payload: Any
    nbytes: int


async def write_loop(link: Any, writer: FrameStream, resend: deque, reader_task: asyncio.Task) -> None:
    """Send `link`'s frames (an OutboundLink) on `writer` until the session ends: first `resend` (what the peer did
    not have), then its lanes by priority, within the peer's credit, the retransmit buffer and the bulk cap; small
    frames joined into one TLS write; through the shaper and the emulated delay."""
    server = link.server
    cap = server.cfg.link.retransmit_buffer_bytes
    # at least two chunks in flight, so the bulk lane never degrades to stop-and-wait
    bulk_cap = max(BULK_INFLIGHT_BYTES, 2 * server.cfg.link.chunk_bytes)
    delay_line: deque[tuple[float, bytes, Any]] = deque()
    wire_wake = asyncio.Event()
    wire_task = asyncio.create_task(_wire(link, writer, delay_line, wire_wake)) if link.delay_s > 0 else None
    transport = writer.transport
    reader_task.add_done_callback(lambda _t: link.wake.set())
    batch: list[Any] = []  # small frames go out in one TLS write: one record and one syscall for many
    popped: Any = None
    batch_bytes = 0
    burst = 0
    try:
        while not reader_task.done():
            if transport.is_closing():
                raise ConnectionResetError("connection to the peer was lost")
            if resend and link.sent_bytes < link.credit:  # (resent frames use credit like new ones)
                seq, lane, head, payload, n = resend.popleft()
            elif (not resend and link.lanes and link.rtx_bytes < cap and link.sent_bytes < link.credit
                  and not (link.rtx_bytes >= bulk_cap and link.lanes.only_bulk())
                  and (popped := link.lanes.pop()) is not None):
                lane, (head, payload, party), n = popped
                seq = link.next_seq
                link.next_seq += 1
                head = relink(head, seq)
                link.rtx.append(Unacked(seq, lane, head, payload, n))
                link.rtx_bytes += n
                server.budget.release(n, party)
            else:
                if batch:
                    writer.write(b"".join(batch))
                    batch, batch_bytes = [], 0
                # a suspended coroutine's locals keep the last frame alive: drop it, so that a worker's
                # shared-memory region goes back as soon as the peer has it (nebula.wire.shm)
                head = payload = popped = None
                link.wake.clear()
                release = link.lanes.next_release()  # (an account held back may go again then)
                link.parked = writer if not resend and wire_task is None else None  # (see write_through)
                try:
                    await asyncio.wait_for(link.wake.wait(), None if release is None
                                           else max(0.0, release - time.monotonic()) + 0.001)
                except asyncio.TimeoutError:
                    pass
                finally:
                    link.parked = None
                continue
            link.sent_bytes += n
            link.bytes_out += n
            server.metrics.count(link.cluster, lane, "out", n)
            wait = link.bucket.take(n)
            if wait > 0:
                if batch:
                    writer.write(b"".join(batch))
                    batch, batch_bytes = [], 0
                await asyncio.sleep(wait)
            if wire_task is not None:
                delay_line.append((time.monotonic() + link.delay_s, head, payload))
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

def write_through(link: Any, lane: Lane, head: bytes, payload: Any, party: Any, n: int) -> bool:
    """Write one large frame of `link` (an OutboundLink) at once, where its write loop would do only that: the loop
    is parked on an empty queue (`link.parked`, its connection), the peer's credit, the retransmit buffer and the
    bulk cap allow it, no shaper or delay applies, the party is not held back and the connection's buffer has room.
    Saves the frame a turn of the event loop and a task wake-up on the way to the peer; False: queue it instead."""
    writer, server = link.parked, link.server
    if (writer is None or n < SMALL_FRAME_BYTES or len(link.lanes) or link.sent_bytes >= link.credit
            or link.bucket.rate is not None or writer.transport.is_closing()
            or link.rtx_bytes >= server.cfg.link.retransmit_buffer_bytes
            or (lane == Lane.BULK and link.rtx_bytes >= max(BULK_INFLIGHT_BYTES, 2 * server.cfg.link.chunk_bytes))
            or writer.transport.get_write_buffer_size() > WRITE_HIGH_WATER
            or (party is not None and link.lanes.held.get(party, 0.0) > time.monotonic())):
        return False
    seq = link.next_seq
    link.next_seq += 1
    head = relink(head, seq)
    link.rtx.append(Unacked(seq, lane, head, payload, n))
    link.rtx_bytes += n
    link.sent_bytes += n
    link.bytes_out += n
    server.metrics.count(link.cluster, lane, "out", n)
    write_frame(writer, head, payload)
    return True


async def _wire(link: Any, writer: FrameStream, line: deque, wake: asyncio.Event) -> None:
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
        head = payload = None  # (see write_loop)
        if writer.transport.get_write_buffer_size() > WRITE_HIGH_WATER:
            await writer.drain()
