"""Frames on their way to local workers: an outbox per worker connection, frames held for ranks not yet connected,
and the hand-over to ZeroMQ by lane priority (payloads through the worker's shared-memory arena when it has one)."""
from __future__ import annotations

__all__ = ["ENDED_TTL_S", "PENDING_TTL_S", "Delivery", "Outbox", "Queued", "Source"]

import asyncio
import time
from typing import Any, Callable, NamedTuple

import zmq

from nebula.wire import FrameType, Lane, LaneQueues, encode_frame
from nebula.wire.shm import SHM_MIN_BYTES, SHM_TAG, pack_desc
from switch_server.budget import Party
from switch_server.host import Host, Origin
from switch_server.localshm import WorkerShm

PENDING_TTL_S = 30.0
ENDED_TTL_S = 2 * PENDING_TTL_S  # how long an ended start is remembered (frames of it still on their way expire)
MAX_ENDED = 100_000

Address = tuple[str, str, int]  # (account, job, rank)
Source = tuple[str, int, int]  # the start a DATA frame comes from: (cluster, rank, incarnation)


class Queued(NamedTuple):
    """A frame waiting for a local worker."""

    head: bytes
    payload: Any
    origin: Origin | None  # told when the frame leaves (a peer session then grants credit)
    data: bool  # a relayed frame, charged to the memory budget (not a control frame of ours for one connection)
    party: Party | None = None  # whom its bytes are charged to (the local account that sent it)
    src: Source | None = None  # the start that sent it (DATA frames): held frames expire when it ends


class Outbox:
    """Frames waiting to be handed to one local worker (or to a rank not yet connected)."""

    __slots__ = ("lanes", "since", "retry")

    def __init__(self) -> None:
        self.lanes = LaneQueues()
        self.since = time.monotonic()
        self.retry: asyncio.TimerHandle | None = None


class Delivery:
    """Queues towards the local workers; `sock` is the ROUTER's synchronous view once the local side is bound."""

    def __init__(self, host: Host, shm_of: Callable[[bytes], WorkerShm | None], gone: Callable[[bytes], None],
                 kick: Callable[[], None]) -> None:
        self.host = host
        self.sock: zmq.Socket | None = None
        self.outboxes: dict[bytes, Outbox] = {}
        self.pending: dict[Address, Outbox] = {}
        self.pending_bytes: dict[str, int] = {}  # per account: bytes held for its ranks that have not connected
        # starts of ranks that have ended, by (account, job, cluster, rank): (newest incarnation ended, when)
        self.ended: dict[tuple[str, str, str, int], tuple[int, float]] = {}
        self._shm_of = shm_of  # the ready arena of a connection, if any
        self._gone = gone  # a connection turned out to be closed
        self._kick = kick  # a send may have eaten the socket's readable edge

    def send_control(self, ident: bytes, ftype: FrameType, meta: dict, seq: int = 0) -> None:
        """Queue a control frame for one worker connection."""
        head = encode_frame(ftype, meta, seq=seq)
        box = self.outboxes.setdefault(ident, Outbox())
        box.lanes.push(Lane.CONTROL, Queued(head, b"", None, False), len(head))
        self.flush(ident)

    def say_bye(self, ident: bytes) -> None:
        """Answer a worker's BYE at once (best effort, ahead of anything still queued for it): the answer tells the
        worker that everything it sent before the BYE has been read, so it may close its socket."""
        if self.sock is None:
            return
        try:
            self.sock.send_multipart([ident, encode_frame(FrameType.BYE)], zmq.NOBLOCK)
        except zmq.ZMQError:  # full or gone: the worker stops waiting for the answer after a moment anyway
            pass

    def deliver(self, addr: Address, ident: bytes | None, lane: Lane, head: bytes, payload: Any,
                origin: Origin | None, party: Party | None = None, src: Source | None = None) -> bool:
        """Queue a frame for the worker at `addr` (connection `ident`, None if that rank has not said hello:
        then it is held for it until PENDING_TTL_S, within the account's limits.pending_bytes, unless the start
        that sent it has ended: a frame no one is waiting for, from a start that is gone, is meant for no later
        start of the rank); False if it was dropped instead (the sender sends it again, end to end, as it does
        for any frame lost, if it is still running)."""
        n = len(head) + len(payload)
        if ident is None and src is not None and self._has_ended(addr, src):
            if origin is not None:
                origin.release(n)
            self.host.metrics.refused.labels(reason="sender_ended").inc()
            return True
        if ident is None:
            held = self.pending_bytes.get(addr[0], 0)
            if held + n > self.host.budgets.pending:
                return False
            self.pending_bytes[addr[0]] = held + n
        self.host.budget.charge(n, party, hold=False)  # (senders are held back by credit and the link's own queue)
        entry = Queued(head, payload, origin, True, party, src)
        if ident is None:
            box = self.pending.get(addr)
            if box is None:
                box = self.pending[addr] = Outbox()
            box.lanes.push(lane, entry, n)
            return True
        box = self.outboxes.get(ident)
        if box is None:
            box = self.outboxes[ident] = Outbox()
        box.lanes.push(lane, entry, n)
        self.flush(ident)
        return True

    def _has_ended(self, addr: Address, src: Source) -> bool:
        ended = self.ended.get((addr[0], addr[1], src[0], src[1]))
        return ended is not None and src[2] <= ended[0]

    def sender_ended(self, account: str, job: str, cluster: str, rank: int, inc: int) -> int:
        """Start `inc` of rank `rank` of (account, job) at `cluster` has ended: frames it sent that are held for
        ranks not connected are dropped, and so are those still on their way (for ENDED_TTL_S); returns how many
        were dropped."""
        k = (account, job, cluster, rank)
        prev = self.ended.pop(k, None)
        self.ended[k] = (max(inc, prev[0] if prev else 0), time.monotonic())
        while len(self.ended) > MAX_ENDED:
            del self.ended[next(iter(self.ended))]
        dropped = 0
        for addr, box in list(self.pending.items()):
            if addr[:2] != (account, job):
                continue
            gone = box.lanes.remove_if(lambda e: e.src is not None and e.src[:2] == (cluster, rank) and e.src[2] <= inc)
            for entry in gone:
                self._unhold(account, len(entry.head) + len(entry.payload))
                self._release(entry)
            dropped += len(gone)
            if not box.lanes:
                del self.pending[addr]
        if dropped:
            self.host.metrics.refused.labels(reason="sender_ended").inc(dropped)
        return dropped

    def _unhold(self, account: str, nbytes: int) -> None:
        left = self.pending_bytes.get(account, 0) - nbytes
        if left > 0:
            self.pending_bytes[account] = left
        else:
            self.pending_bytes.pop(account, None)

    def adopt(self, addr: Address, ident: bytes) -> None:
        """A connection took the rank at `addr`: frames held for that rank are now its own."""
        box = self.pending.pop(addr, None)
        if box is not None:
            self._unhold(addr[0], box.lanes.bytes)
            mine = self.outboxes.setdefault(ident, Outbox())
            while (item := box.lanes.pop()) is not None:
                mine.lanes.push(*item)

    def drop(self, ident: bytes, addr: Address | None) -> None:
        """A connection is gone: keep its relayed frames for the rank's next connection (`addr`; it gets them
        without a resend), release the rest."""
        box = self.outboxes.pop(ident, None)
        if box is None:
            return
        if box.retry is not None:
            box.retry.cancel()
        if addr is not None and box.lanes:
            # (kept whatever the account's pending budget: they were admitted once, and the rank may come back)
            held = self.pending.setdefault(addr, Outbox())
            while (item := box.lanes.pop()) is not None:
                lane, entry, n = item
                if entry.data:  # not a control frame meant for the old connection
                    held.lanes.push(lane, entry, n)
                    self.pending_bytes[addr[0]] = self.pending_bytes.get(addr[0], 0) + n
                else:
                    self._release(entry)
        else:
            for entry in box.lanes.clear():
                self._release(entry)

    def sweep(self) -> None:
        """Drop frames held for ranks that never said hello, and forget starts ended long ago."""
        now = time.monotonic()
        while self.ended:
            k = next(iter(self.ended))
            if now - self.ended[k][1] <= ENDED_TTL_S:
                break
            del self.ended[k]
        for addr, box in list(self.pending.items()):
            if now - box.since > PENDING_TTL_S:
                self._unhold(addr[0], box.lanes.bytes)
                for entry in box.lanes.clear():
                    self._release(entry)
                del self.pending[addr]

    def _release(self, entry: Queued) -> None:
        n = len(entry.head) + len(entry.payload)
        if entry.data:
            self.host.budget.release(n, entry.party)
        if entry.origin is not None:
            entry.origin.release(n)

    def flush(self, ident: bytes) -> None:
        """Hand queued frames to ZeroMQ by priority until its per-worker queue is full."""
        self._flush(ident)
        self._kick()

    def _flush(self, ident: bytes) -> None:
        box = self.outboxes.get(ident)
        if box is None or self.sock is None:
            return
        if box.retry is not None:
            box.retry.cancel()
            box.retry = None
        sock = self.sock
        metrics = self.host.metrics
        shm = self._shm_of(ident)
        while True:
            item = box.lanes.pop()
            if item is None:
                break
            lane, entry, n = item
            head, payload = entry.head, entry.payload
            off = placed = None
            if shm is not None and entry.data and len(payload) >= SHM_MIN_BYTES:
                off = placed = shm.placed_at(payload)  # (decrypted into this worker's arena: nothing to copy)
                if off is None:
                    off = shm.down_alloc(len(payload))  # (None when the worker still holds too much: inline then)
                    if off is not None:
                        shm.arena.down[off : off + len(payload)] = payload
            if off is not None:
                parts = [ident, head, SHM_TAG, pack_desc(shm.arena.token, off, len(payload))]
            else:
                parts = [ident, head, payload] if payload else [ident, head]
            try:
                sock.send_multipart(parts, zmq.NOBLOCK, copy=False)
            except zmq.Again:
                if placed is not None:
                    shm.unhand(payload)
                elif off is not None:
                    shm.down.free(off)
                box.lanes.push_front(lane, entry, n)
                box.retry = asyncio.get_running_loop().call_later(0.001, self.flush, ident)
                return
            except zmq.ZMQError as exc:
                if exc.errno == zmq.EHOSTUNREACH:  # the worker went away; its frames will be retransmitted end to end
                    if placed is not None:
                        shm.unhand(payload)
                    elif off is not None:
                        shm.down.free(off)
                    box.lanes.push_front(lane, entry, n)
                    self._gone(ident)
                    return
                raise
            if payload:
                metrics.count("local", lane, "out", n)
                if off is not None:
                    metrics.shm_bytes["out"] += len(payload)
                    if placed is not None:
                        metrics.shm_bytes["placed"] += len(payload)
            self._release(entry)
