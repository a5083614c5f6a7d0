"""Every channel of one endpoint, as the I/O thread drives them: each channel's Sender and Receiver
(`nebula.channel.delivery`), the inboxes its application side reads, and the frames that go out for them (DATA in
the lanes, acknowledgements when `nebula.channel.acks` says they are due). Only the I/O thread calls in here,
except `Inbox`'s application side."""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from nebula.channel.acks import AckSchedule
from nebula.channel.arena import ArenaClient, Region
from nebula.channel.delivery import Delivered, OutMessage, Receiver, Sender
from nebula.channel.sender import TRANSIT_BYTES, batches
from nebula.channel.errors import ChannelError
from nebula.channel.outlet import Outlet
from nebula.channel.throughput import ThroughputMeter
from nebula.wire import ChannelKey, FrameType, encode_frame

__all__ = ["ChannelKeys", "Inbox", "Streams"]

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Inbox:
    """What a channel's application side and the I/O thread share: delivered messages and refusals, and how many
    messages the application took (`taken`, counted by it; the I/O thread reads the count instead of being woken
    for every message)."""

    cond: threading.Condition = field(default_factory=threading.Condition)
    ready: deque[Delivered] = field(default_factory=deque)
    errors: deque[BaseException] = field(default_factory=deque)
    taken: int = 0  # messages the application took (written by it alone)
    seen: int = 0  # of those, the ones the I/O thread has counted as consumed (written by it alone)


class ChannelKeys(Protocol):
    """What the I/O thread needs of a channel: its two stream keys."""

    tx_key: ChannelKey
    rx_key: ChannelKey


class Streams:
    """The channels of one endpoint: sending and receiving state, inboxes, acknowledgements."""

    def __init__(self, out: Outlet, shm: ArenaClient, window_bytes: int, job: str, cluster: str, rank: int,
                 transit_bytes: int = TRANSIT_BYTES) -> None:
        self.out, self.shm, self.window_bytes, self.transit_bytes = out, shm, window_bytes, transit_bytes
        self.job, self.cluster, self.rank = job, cluster, rank
        self.inc = 0  # this start's incarnation, once our switch gave it
        self.chunk_bytes = 256 * 1024  # (our switch's, from its WELCOME)
        self.max_message_bytes = 1 << 62
        self.tx: dict[int, Sender] = {}
        self.rx: dict[int, Receiver] = {}
        self.meters: dict[str, ThroughputMeter] = {}  # per peer cluster: its link's throughput, from acknowledgements
        self.inboxes: dict[int, Inbox] = {}  # by rx channel id
        self.tx_inboxes: dict[int, Inbox] = {}  # by tx channel id
        self.acks = AckSchedule()
        # rx channels the application took messages from since the I/O thread last looked (appended by application
        # threads, taken by the I/O thread: a look costs what was consumed, not what is open)
        self.taken: deque[int] = deque()
        # Endpoint.watch: rx channels that received messages, oldest first (None: not recorded)
        self.watched: dict[int, ChannelKey] | None = None
        self.watch_cond = threading.Condition()
        self.bad_acks = 0  # acknowledgements refused as claiming more than was sent (a forged or broken peer)
        self.unacked = True  # some message may wait for its acknowledgement: check timeouts every 0.5 s
        # runs of messages submitted and admitted since the I/O thread last framed (`frame_submitted`), by stream:
        # the commands of one wake-up are framed together, so that a burst of small messages shares frames; a shared
        # message (`OutMessage.share`) starts a run of its own, so those are framed in the order they were sent (a
        # model's pieces to many peers, piece by piece: each piece is still in its switch's slot for the next peer)
        self.submitted: list[tuple[int, list[OutMessage]]] = []
        self.last_run: dict[int, list[OutMessage]] = {}  # each stream's latest run in `submitted`

    # ---- commands of the application side ----
    def open(self, ch: ChannelKeys, inbox: Inbox) -> None:
        """Open a channel's two streams; `inbox` takes what arrives (and what arrived before it was opened)."""
        if ch.tx_key.id not in self.tx:
            tx = self.tx[ch.tx_key.id] = Sender(ch.tx_key, self.window_bytes, self.inc, self.transit_bytes)
            tx.meter = self.meters.setdefault(ch.tx_key.dst_cluster, ThroughputMeter())
        self.tx_inboxes[ch.tx_key.id] = inbox
        cid = ch.rx_key.id
        if cid not in self.rx:
            self.rx[cid] = Receiver(ch.rx_key, self.inc)
        old = self.inboxes.get(cid)
        if old is not None:  # messages that arrived before the application opened the channel
            with old.cond:
                moved = list(old.ready), list(old.errors)
            with inbox.cond:  # a reader may already wait on the new inbox: wake it
                inbox.ready.extend(moved[0])
                inbox.errors.extend(moved[1])
                inbox.cond.notify_all()
        self.inboxes[cid] = inbox

    def submit(self, tx_id: int, msg: OutMessage) -> None:
        """Queue a message on a sending stream (framed by the next `frame_submitted`)."""
        self.unacked = True  # (until the next check finds every message acknowledged)
        admitted = self.tx[tx_id].submit(msg)
        run = self.last_run.get(tx_id)
        if run is not None and len(admitted) == 1 and admitted[0].share is None and run[-1].share is None:
            run.append(admitted[0])  # (the common case: one more message on a stream with a run open)
            return
        for m in admitted:
            if run is None or m.share is not None or run[-1].share is not None:
                run = self.last_run[tx_id] = []
                self.submitted.append((tx_id, run))
            run.append(m)

    def frame_submitted(self) -> None:
        """Frame what `submit` admitted since the last call."""
        if self.submitted:
            for tx_id, msgs in self.submitted:
                self.queue(self.tx[tx_id], msgs)
            self.submitted.clear()
            self.last_run.clear()

    def watch(self) -> None:
        """Start recording the channels that receive messages (those already holding some included)."""
        with self.watch_cond:
            if self.watched is None:
                self.watched = {cid: self.rx[cid].key for cid, box in self.inboxes.items()
                                if box.ready and cid in self.rx}
                self.watch_cond.notify_all()

    def ready(self, timeout_s: float, running: Callable[[], bool]) -> list[ChannelKey]:
        """Receiving keys of the channels that got messages since the last call, oldest first; [] on timeout."""
        deadline = time.monotonic() + timeout_s
        with self.watch_cond:
            while not self.watched:
                left = deadline - time.monotonic()
                if left <= 0 or not running():
                    return []
                self.watch_cond.wait(min(left, 1.0))
            out = list(self.watched.values())
            self.watched.clear()
        return out

    # ---- sending ----
    def queue(self, tx: Sender, msgs: list[OutMessage]) -> None:
        """Frame `msgs` (in sequence order; runs of small ones share frames) and queue the frames in their lanes."""
        if not msgs:
            return
        now = time.monotonic()
        for run in batches(msgs, self.chunk_bytes) if len(msgs) > 1 else [msgs]:
            if len(run) > 1:
                self.out.push(run[0].lane, (tx.batch_frame(run, now),))
            else:
                self.out.push(run[0].lane, tx.frames(run[0], self.chunk_bytes, now))

    def resend(self, tx: Sender, why: str) -> None:
        """Send every message of `tx` still unacknowledged again."""
        msgs = tx.resendable()
        if msgs:
            self.queue(tx, msgs)
            log.info("resending %d messages on %s (%s)", len(msgs), tx.key.name, why)

    def check_timeouts(self, now: float) -> None:
        """Send again what had no acknowledgement for its timer's time."""
        self.unacked = False
        for tx in self.tx.values():
            self.unacked = self.unacked or not tx.idle
            for msg in tx.timed_out(now):
                log.info("no acknowledgement of %s #%d for %.0f s: sending it again", tx.key.name, msg.seq,
                         tx.stalled_s(msg, now))
                self.queue(tx, [msg])

    def idle(self) -> bool:
        """Whether every message sent so far is acknowledged."""
        return all(t.idle for t in list(self.tx.values()))

    # ---- receiving ----
    def on_error(self, frame: Any) -> None:
        """A refusal that names one of our channels (its message fails; the channel goes on)."""
        code, message = frame.meta["code"], frame.meta["message"]
        key = ChannelKey.from_meta(frame.meta["channel"])
        err = ChannelError(f"{code}: {message}")
        tx = self.tx.get(key.id)
        if tx is None:
            log.warning("switch refused a frame of channel %s: %s: %s", key.name, code, message)
            return
        self.queue(tx, tx.on_refused(frame.header.seq, err))
        inbox = self.tx_inboxes.get(key.id)
        if inbox is not None:
            with inbox.cond:
                inbox.errors.append(err)
                inbox.cond.notify_all()

    def on_ack(self, frame: Any, *_: Any) -> None:
        """An acknowledgement of one of our sending streams."""
        tx = self.tx.get(frame.header.channel_id)
        if tx is None or not tx.ours(frame.meta):  # (an acknowledgement a predecessor of ours earned is not)
            return
        seq, consumed = frame.header.seq, frame.meta["consumed"]
        if tx.relearn:
            if seq or consumed:
                log.warning("channel %r: an acknowledgement names a new start of %s/%d with messages it cannot "
                            "have; ignored", tx.key.name, tx.key.dst_cluster, tx.key.dst_rank)
                return
            msgs = tx.restart_stream()
            log.info("channel %r: %s/%d restarted; sending again, from #1, the %d messages it had not consumed",
                     tx.key.name, tx.key.dst_cluster, tx.key.dst_rank, len(tx.unacked))
            self.queue(tx, msgs)
            return
        why = tx.ack_refusal(seq, consumed)
        if why is not None:
            self.bad_acks += 1
            if self.bad_acks in (1, 100, 10000):
                log.warning("channel %r: refused %d acknowledgement(s) from %s/%d; the latest: %s", tx.key.name,
                            self.bad_acks, tx.key.dst_cluster, tx.key.dst_rank, why)
            return
        self.queue(tx, tx.on_ack(seq, consumed, time.monotonic()))

    def on_data(self, frame: Any, payload: Any, region: Region | None) -> None:
        """A chunk of a message for us: reassembled, delivered in order, acknowledged when due."""
        h = frame.header
        if not self.inc:  # (our switch welcomes us before it hands us any message)
            self.shm.release(region)
            return
        rx = self.rx.get(h.channel_id)
        if rx is None:
            key = frame.key()
            if key.dst_rank != self.rank or key.dst_cluster != self.cluster or key.job != self.job:
                log.warning("dropping a frame addressed to %s", key)
                self.shm.release(region)
                return
            rx = self.rx[h.channel_id] = Receiver(key, self.inc)
            self.inboxes.setdefault(h.channel_id, Inbox())
        stale = rx.stale
        out = rx.on_chunk(h, payload, frame.meta.get("parts"), self.max_message_bytes, region, frame.meta)
        if rx.stale != stale and rx.stale in (1, 100, 10000):
            log.warning("channel %r from %s/%d: dropped %d message chunks sent by or to an earlier start of a rank "
                        "(a switch kept them across the restart)", rx.key.name, rx.key.src_cluster, rx.key.src_rank,
                        rx.stale)
        for r in out.release:
            self.shm.release(r)
        if out.ack:
            self.acks.owe(h.channel_id, time.monotonic(), len(out.ready), len(payload) if out.ready else 0)
        if out.refused is not None:
            log.warning("%s", out.refused)
        if out.ready:
            inbox = self.inboxes[h.channel_id]
            with inbox.cond:
                inbox.ready.extend(out.ready)
                inbox.cond.notify_all()
            if self.watched is not None:
                with self.watch_cond:
                    self.watched.setdefault(h.channel_id, rx.key)
                    self.watch_cond.notify_all()

    def take_consumed(self, cid: int) -> None:
        """Count what the application took from channel `cid` since the last look (its acknowledgement is owed)."""
        inbox, rx = self.inboxes.get(cid), self.rx.get(cid)
        if inbox is None or rx is None:
            return
        taken = inbox.taken
        if taken != inbox.seen:
            rx.consumed += taken - inbox.seen
            inbox.seen = taken
            self.acks.owe(cid, time.monotonic())

    def take_all_consumed(self) -> None:
        """`take_consumed` for every channel the application took messages from since the last look."""
        taken = self.taken
        while taken:
            self.take_consumed(taken.popleft())

    def flush_acks(self, force: bool = False) -> None:
        """Queue the acknowledgements that are due (all that are owed, with `force`)."""
        acks = self.acks
        if not acks.owed or not (force or acks.due(time.monotonic())):
            return
        self.take_all_consumed()
        for cid in acks.take():
            rx = self.rx.get(cid)
            if rx is None:
                continue
            recv_seq, consumed = rx.ack_state()
            meta = {**rx.key.to_meta(), **rx.ack_meta(), "consumed": consumed}
            self.out.control(encode_frame(FrameType.ACK, meta, channel_id=cid, seq=recv_seq))
