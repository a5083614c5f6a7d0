"""Reliable delivery on one channel as pure state: sequence numbers, the sender's window, acknowledgements,
resends, chunking, and the receiver's reassembly and in-order delivery.

No sockets and no clocks: the I/O thread passes `now` in, sends the frames a `Sender` returns, and hands the
chunks it receives to a `Receiver`, which says what to acknowledge, deliver and release. What the receiver
consumed opens the sender's window (credit-based flow control from end to end).

Incarnations: every endpoint (one start of a worker process) has an incarnation number, which its switch gives
it (`switch_server.incarnations`: the switch's boot epoch and a counter, so a later start of the same rank has a
larger one whatever the hosts' clocks say) and checks on every frame it sends. A DATA frame carries its sender's
(`inc`) and the receiver's incarnation it is addressed to (`to`, learnt from the receiver's acknowledgements; 0
until then); an ACK carries the receiver's (`inc`) and the sender's it acknowledges (`to`). Sequence numbers start
again at 1 in every incarnation, and switches keep undelivered messages for a rank across its restarts, so
without these a restarted rank would take messages meant for its predecessor (or acknowledgements its predecessor
earned) as its own: a receiver drops messages from an earlier incarnation of its sender and starts the stream
afresh when a later one speaks; a sender ignores acknowledgements meant for an earlier incarnation of itself.

A receiver restarted alone announces itself: a message addressed to its predecessor is dropped and answered with
an acknowledgement of nothing from the new incarnation, and the sender, learning it, sends again, numbered from 1,
every message its predecessor had not consumed (a sender keeps each message until its receiver consumed it, which
the window bounds). Every acknowledgement is bounded by what the sender knows: one that claims more than was sent
is refused, and the channel goes on.
"""
from __future__ import annotations

import math
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from nebula.channel.errors import ChannelError
from nebula.wire import ChannelKey, FrameType, Header, Lane, encode_frame, encode_meta

__all__ = ["MAX_AHEAD", "RTO_S", "RTO_MAX_S", "RTO_BYTES_PER_S", "OutMessage", "OutFrame", "Admitted", "Sender",
           "Delivered", "Reassembly", "Outcome", "Receiver"]

RTO_S = 10.0  # resend a message with no acknowledgement progress for this long (then doubling)
RTO_MAX_S = 60.0
RTO_BYTES_PER_S = 4e6  # the slowest link the fallback timer allows for before resending
# messages a receiver keeps ahead of the next one it delivers (complete or partial): a sender's window keeps a
# behaving sender far below this; a forged sequence number far ahead is dropped instead of held for ever
MAX_AHEAD = 1 << 16


@dataclass(eq=False, slots=True)
class OutMessage:
    """One message on its way; its sender keeps it until the receiver acknowledges it."""

    data: memoryview
    parts: list[int] | None  # part lengths as given to Channel.send, or None for one part
    lane: Lane
    future: Future  # completes once every frame of the first transmission has left for the switch
    seq: int = 0
    pending_frames: int = 0  # frames framed but not yet handed to ZeroMQ
    progress: float = 0.0  # when it last made progress (framed, fully sent, acknowledgement progress)
    rto: float = RTO_S
    sent_at: float = 0.0  # when its first transmission was framed (the link throughput meter's start)

    def frame_sent(self, now: float) -> None:
        """One of its frames left for the switch; once all have, the future completes."""
        self.pending_frames -= 1
        if self.pending_frames == 0:
            self.progress = now
            if not self.future.done():
                self.future.set_result(None)


class OutFrame(NamedTuple):
    """A frame waiting in a lane: head (header and meta), payload, and the message it belongs to (if any)."""

    head: bytes
    payload: Any
    msg: OutMessage | None


class Admitted(NamedTuple):
    """A message the window let through and the receiver has not consumed yet (kept for a restarted receiver)."""

    seq: int
    nbytes: int
    msg: OutMessage


class Sender:
    """The sending half of one channel: numbers messages, admits them by window, frames, acknowledges, resends."""

    def __init__(self, key: ChannelKey, window_bytes: int, inc: int = 0) -> None:
        self.key = key
        self.inc = inc  # this endpoint's incarnation
        self.peer_inc = 0  # the receiver's, once an acknowledgement named it
        self.meta = self._meta()
        self.window_bytes = window_bytes
        self.next_seq = 1
        self.unacked: dict[int, OutMessage] = {}  # by seq, in order
        self.waiting: deque[OutMessage] = deque()  # not yet admitted by the window
        self.admitted: deque[Admitted] = deque()  # admitted and not yet consumed, in seq order
        self.inflight = 0  # bytes admitted and not yet consumed
        self.acked = 0  # highest seq the receiver has (cumulative)
        self.ack_progress = 0.0  # when acknowledgements last moved `acked` on (progress of every message)
        self.consumed = 0  # highest seq the receiver's application has taken
        self.meter: Any = None  # a ThroughputMeter of the peer cluster's link, fed with every acknowledged message
        self.relearn = False  # an ACK named a new incarnation of the receiver: the stream starts again for it

    def _meta(self) -> bytes:
        return encode_meta({**self.key.to_meta(), "inc": self.inc, "to": self.peer_inc})

    def ours(self, meta: dict[str, Any]) -> bool:
        """Whether an ACK (its meta) acknowledges this incarnation's messages and comes from the receiver's newest
        incarnation; a later incarnation of the receiver is learnt from it (see `restart_stream`)."""
        if meta.get("to", 0) != self.inc:
            return False
        inc = meta.get("inc", 0)
        if inc < self.peer_inc:
            return False  # a straggler of the receiver's predecessor
        if inc > self.peer_inc:
            self.relearn = self.peer_inc != 0
            self.peer_inc = inc
            self.meta = self._meta()
        return True

    def restart_stream(self) -> list[OutMessage]:
        """A new incarnation of the receiver announced itself: every message its predecessor had not consumed is
        numbered afresh from 1 (in order) and addressed to it; returns those the window lets through now."""
        self.relearn = False
        msgs = [a.msg for a in self.admitted] + list(self.waiting)
        self.unacked.clear()
        self.admitted.clear()
        self.waiting.clear()
        self.inflight = self.acked = self.consumed = 0
        self.next_seq = 1
        for msg in msgs:
            msg.seq = self.next_seq
            self.next_seq += 1
            self.unacked[msg.seq] = msg
            self.waiting.append(msg)
        return self._admit()

    @property
    def idle(self) -> bool:
        """True when every submitted message is acknowledged."""
        return not self.unacked and not self.waiting

    def submit(self, msg: OutMessage) -> list[OutMessage]:
        """Number `msg` and queue it behind the window; returns the messages the window now lets through."""
        msg.seq = self.next_seq
        self.next_seq += 1
        self.unacked[msg.seq] = msg
        self.waiting.append(msg)
        return self._admit()

    def _admit(self) -> list[OutMessage]:
        out = []
        while self.waiting:
            msg = self.waiting[0]
            n = len(msg.data)
            if self.inflight and self.inflight + n > self.window_bytes:
                break
            self.waiting.popleft()
            self.admitted.append(Admitted(msg.seq, n, msg))
            self.inflight += n
            out.append(msg)
        return out

    def frames(self, msg: OutMessage, chunk_bytes: int, now: float) -> list[OutFrame]:
        """The DATA frames of one (re)transmission of `msg`, in chunks of at most `chunk_bytes`."""
        total = len(msg.data)
        count = max(1, math.ceil(total / chunk_bytes))
        size = math.ceil(total / count) if total else 0
        out = []
        for i in range(count):
            payload = msg.data[i * size : (i + 1) * size]
            meta = self.meta
            if i == 0 and msg.parts is not None:
                meta = encode_meta({**self.key.to_meta(), "inc": self.inc, "to": self.peer_inc, "parts": msg.parts})
            head = encode_frame(FrameType.DATA, meta, payload, lane=msg.lane, channel_id=self.key.id, seq=msg.seq,
                                chunk_index=i, chunk_count=count, total_len=total)
            out.append(OutFrame(head, payload, msg))
        msg.pending_frames += count
        msg.progress = now
        msg.sent_at = msg.sent_at or now
        # a large message may wait long behind others on a slow link: the fallback timer grows with its size
        msg.rto = max(msg.rto, RTO_S + total / RTO_BYTES_PER_S)
        return out

    def ack_refusal(self, recv_seq: int, consumed: int) -> str | None:
        """Why an acknowledgement cannot be true (it claims messages never sent, or more consumed than received),
        or None: the sender's own count bounds what an ACK may say, so a forged one costs nothing."""
        sent = self.next_seq - 1
        if recv_seq > sent:
            return f"it acknowledges message #{recv_seq}, but only {sent} were sent on this channel"
        if consumed > recv_seq:
            return f"it says {consumed} messages were consumed of the {recv_seq} received"
        return None

    def on_ack(self, recv_seq: int, consumed: int, now: float) -> list[OutMessage]:
        """The receiver has every message up to `recv_seq` and consumed up to `consumed`; returns newly admitted.
        Call `ack_refusal` first: an acknowledgement beyond what was sent is not taken."""
        if self.ack_refusal(recv_seq, consumed) is not None:
            return []
        progressed = False
        if recv_seq > self.acked:
            for seq in range(self.acked + 1, recv_seq + 1):
                msg = self.unacked.pop(seq, None)
                if msg is not None and not msg.future.done():
                    msg.future.set_result(None)
                if msg is not None and self.meter is not None and msg.sent_at:
                    self.meter.record(len(msg.data), msg.sent_at, now)
            self.acked = recv_seq
            progressed = True
        admitted: list[OutMessage] = []
        if consumed > self.consumed:
            self.consumed = consumed
            while self.admitted and self.admitted[0].seq <= consumed:
                self.inflight -= self.admitted.popleft().nbytes
            admitted = self._admit()
        if progressed:
            # one time for all: stamping every unacknowledged message made each ACK cost O(messages in flight),
            # quadratic in a stream of small messages
            self.ack_progress = now
        return admitted

    def on_refused(self, seq: int, err: ChannelError) -> list[OutMessage]:
        """The switch refused message `seq`: fail its future, free its window share; returns newly admitted."""
        msg = self.unacked.pop(seq, None)
        if msg is None:
            return []
        for i, adm in enumerate(self.admitted):
            if adm.seq == seq:
                del self.admitted[i]
                self.inflight -= adm.nbytes
                break
        if not msg.future.done():
            msg.future.set_exception(err)
        return self._admit()

    def _sent_and_admitted(self) -> list[OutMessage]:
        seqs = {a.seq for a in self.admitted}
        return [m for m in self.unacked.values() if m.pending_frames == 0 and m.seq in seqs]

    def resendable(self) -> list[OutMessage]:
        """Unacknowledged messages to send again now (a switch restarted): all that have fully left."""
        return self._sent_and_admitted() if self.unacked else []

    def stalled_s(self, msg: OutMessage, now: float) -> float:
        """Seconds since `msg` or the channel's acknowledgements last made progress."""
        return now - max(msg.progress, self.ack_progress)

    def timed_out(self, now: float) -> list[OutMessage]:
        """Messages without acknowledgement progress for longer than their timer; their timers double."""
        if now - self.ack_progress <= RTO_S:  # acknowledgements moved lately: nothing is late (rto >= RTO_S)
            return []
        late = [m for m in self.unacked.values() if m.pending_frames == 0 and self.stalled_s(m, now) > m.rto]
        if not late:
            return []
        seqs = {a.seq for a in self.admitted}
        out = []
        for msg in late:
            if msg.seq in seqs:
                msg.rto = max(msg.rto, min(msg.rto * 2, RTO_MAX_S))
                out.append(msg)
        return out


class Delivered(NamedTuple):
    """A complete message in its place in the stream: its bytes and parts, or why it was refused."""

    data: bytes
    parts: list[int] | None
    error: ChannelError | None = None


@dataclass(eq=False, slots=True)
class Reassembly:
    """The chunks of one message received so far (kept by index: nothing is sized by what the wire claims)."""

    count: int
    total_bytes: int
    chunks: dict[int, Any] = field(default_factory=dict)
    received_bytes: int = 0
    parts: list[int] | None = None
    regions: list[Any] = field(default_factory=list)  # shared-memory regions to hand back once joined


@dataclass(eq=False, slots=True)
class Outcome:
    """What the I/O side does after a chunk: acknowledge, deliver `ready` in order, release `release`."""

    ack: bool = False
    ready: list[Delivered] = field(default_factory=list)
    release: list[Any] = field(default_factory=list)
    refused: ChannelError | None = None


class Receiver:
    """The receiving half of one channel: drops duplicates, reassembles chunks, delivers in order, exactly once."""

    def __init__(self, key: ChannelKey, inc: int = 0) -> None:
        self.key = key
        self.inc = inc  # this endpoint's incarnation
        self.peer_inc = 0  # the incarnation of the sender whose stream this is (0: none heard yet)
        self.stale = 0  # messages dropped as meant for or sent by an earlier incarnation
        self.ahead = 0  # chunks dropped as numbered too far ahead of the stream (MAX_AHEAD)
        self.announced: int | None = None  # the sender incarnation we told of ourselves (it addressed our predecessor)
        self.expected = 1  # next seq to deliver
        self.partial: dict[int, Reassembly] = {}
        self.complete: dict[int, Delivered] = {}  # complete, waiting for an earlier seq
        self.consumed = 0  # messages the application has taken

    def ack_state(self) -> tuple[int, int]:
        """(highest seq received in order, messages consumed): what an ACK frame carries."""
        return self.expected - 1, self.consumed

    def ack_meta(self) -> dict[str, Any]:
        """The incarnation fields of an ACK: ours, and the sender's it acknowledges."""
        return {"inc": self.inc, "to": self.peer_inc}

    def admits(self, meta: dict[str, Any], out: Outcome) -> bool:
        """Whether a DATA frame (its meta) belongs to this stream; a later incarnation of the sender starts the
        stream afresh (what the earlier one left half-received is released into `out`).

        A frame addressed to an earlier incarnation of ours comes from a sender that has not learnt of us: it is
        dropped and answered with an acknowledgement of nothing (`out.ack`), which tells the sender who we are;
        from then on only frames addressed to us are taken from that sender (its stream starts again at 1)."""
        to, inc = meta.get("to", 0), meta.get("inc", 0)
        if inc < self.peer_inc or to > self.inc:
            self.stale += 1  # sent by an earlier start of the sender, or meant for a later start of ours
            return False
        if inc > self.peer_inc:
            if self.peer_inc:
                self._restart(out)
            self.peer_inc = inc
        if to == self.inc or (to == 0 and self.announced != inc):
            return True
        self.stale += 1
        if self.announced != inc:
            self.announced = inc
            self._restart(out)
        out.ack = True
        return False

    def _restart(self, out: Outcome) -> None:
        for entry in self.partial.values():
            out.release.extend(entry.regions)
        self.partial.clear()
        self.complete.clear()
        self.expected, self.consumed = 1, 0

    def consume(self) -> None:
        """The application took the next delivered message."""
        self.consumed += 1

    def on_chunk(self, h: Header, payload: Any, parts: list[int] | None, max_message_bytes: int,
                 region: Any = None, meta: dict[str, Any] | None = None) -> Outcome:
        """Take one DATA chunk (with the shared-memory `region` it lies in, if any, and its frame's `meta` for
        the incarnation fields); see `Outcome`.

        `max_message_bytes` bounds what a message may claim before any state is kept for it; a message over it
        (or whose chunks do not add up) is refused in its place in the stream, so the ones after it still arrive.
        """
        out = Outcome()
        if meta is not None and not self.admits(meta, out):
            if region is not None:
                out.release.append(region)
            return out  # nothing to acknowledge: that stream is over
        seq = h.seq
        if seq < self.expected or seq in self.complete:
            out.ack = True  # a duplicate: acknowledged again, delivered once
            if region is not None:
                out.release.append(region)
            return out
        if seq - self.expected >= MAX_AHEAD:
            self.ahead += 1  # no window lets a sender this far ahead: not kept (a real one is sent again)
            if region is not None:
                out.release.append(region)
            return out
        entry = self.partial.get(seq)
        if entry is None:
            why = self._refusal(h, max_message_bytes)
            if why is not None:
                return self._refuse(seq, why, out, region)
            if h.chunk_count == 1:  # the common case: nothing to join
                if region is not None:
                    out.release.append(region)
                return self._complete(seq, Delivered(bytes(payload), parts), out)
            entry = self.partial[seq] = Reassembly(h.chunk_count, h.total_len)
        if h.chunk_count != entry.count or not 0 <= h.chunk_index < entry.count or h.chunk_index in entry.chunks:
            if region is not None:
                out.release.append(region)
            return out
        entry.received_bytes += len(payload)
        if entry.received_bytes > entry.total_bytes:
            del self.partial[seq]
            out.release.extend(entry.regions)
            return self._refuse(seq, f"its chunks carry more than the {entry.total_bytes} bytes it declares", out,
                                region)
        entry.chunks[h.chunk_index] = payload
        if region is not None:
            entry.regions.append(region)
        if h.chunk_index == 0 and parts is not None:
            entry.parts = parts
        if len(entry.chunks) < entry.count:
            return out
        del self.partial[seq]
        chunks = entry.chunks
        data = b"".join([chunks[i] for i in range(entry.count)])
        out.release.extend(entry.regions)  # copied out: the arena's regions may be reused
        if len(data) != entry.total_bytes:
            return self._refuse(seq, f"its chunks carry {len(data)} bytes, not the {entry.total_bytes} it declares",
                                out, None)
        return self._complete(seq, Delivered(data, entry.parts), out)

    def _refusal(self, h: Header, limit: int) -> str | None:
        if h.total_len > limit:
            return (f"it declares {h.total_len} bytes, more than link.max_message_bytes={limit} of this cluster's "
                    "switch; the sender must split it (or both clusters raise link.max_message_bytes)")
        if h.chunk_count > max(1, h.total_len):
            return (f"it declares {h.chunk_count} chunks for {h.total_len} bytes (every chunk carries at least "
                    "one byte), so its header is corrupt or forged")
        return None

    def _refuse(self, seq: int, why: str, out: Outcome, region: Any) -> Outcome:
        k = self.key
        err = ChannelError(f"message_refused: message #{seq} on channel {k.name!r} from {k.src_cluster}/{k.src_rank} "
                           f"was dropped: {why}")
        if region is not None:
            out.release.append(region)
        out.refused = err
        return self._complete(seq, Delivered(b"", None, err), out)

    def _complete(self, seq: int, msg: Delivered, out: Outcome) -> Outcome:
        out.ack = True  # acknowledged per complete message, not per chunk
        if seq != self.expected:
            self.complete[seq] = msg
            return out
        out.ready.append(msg)
        self.expected += 1
        while self.expected in self.complete:
            out.ready.append(self.complete.pop(self.expected))
            self.expected += 1
        return out
