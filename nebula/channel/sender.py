"""The sending half of a channel as pure state (see `nebula.channel.delivery` for the protocol): sequence numbers,
the window, chunking, acknowledgements, resends and restarted receivers."""
from __future__ import annotations

import math
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, NamedTuple

from nebula.channel.arena import Pieces
from nebula.channel.errors import ChannelError
from nebula.wire import ChannelKey, FrameType, Lane, encode_frame, encode_meta
from nebula.wire.batch import BATCH_ENTRY_BYTES, MAX_BATCH, pack_table

__all__ = ["BATCH_BELOW_BYTES", "TRANSIT_BYTES",
           "RTO_S", "RTO_MAX_S", "RTO_BYTES_PER_S", "OutMessage", "OutBatch", "OutFrame",
           "Admitted", "Sender", "batches"]

RTO_S = 10.0  # resend a message with no acknowledgement progress for this long (then doubling)
RTO_MAX_S = 60.0
RTO_BYTES_PER_S = 4e6  # the slowest link the fallback timer allows for before resending
@dataclass(eq=False, slots=True)
class OutMessage:
    """One message on its way; its sender keeps it until the receiver acknowledges it."""

    # bytes as the application gave them (immutable, and not an object the cyclic collector visits), else a byte view
    data: bytes | memoryview
    parts: list[int] | None  # part lengths as given to Channel.send, or None for one part
    lane: Lane
    future: Future  # completes once every frame of the first transmission has left for the switch
    tx_id: int = 0  # its channel's sending stream (`ChannelKeys.tx_key.id`): the message is its own I/O command
    seq: int = 0
    pending_frames: int = 0  # frames framed but not yet handed to ZeroMQ
    progress: float = 0.0  # when it last made progress (framed, fully sent, acknowledgement progress)
    rto: float = RTO_S
    sent_at: float = 0.0  # when its first transmission was framed (the link throughput meter's start)
    # the batch frame it last went in, as (first seq, message count); None: its last transmission was its own.
    # Sequence numbers, not the OutBatch: a message pointing back at the batch that holds it would make a reference
    # cycle per batch, which only the cyclic collector frees, in full collections whose cost grows with what a
    # stream of small messages keeps in flight (tens of ms each at 16 KiB, a third of the sending worker's CPU)
    batch: tuple[int, int] | None = None
    share: Any = None  # names its bytes, the same in every message sent with this key (`Channel.send`'s `share`)

    def frame_sent(self, now: float) -> None:
        """One of its frames left for the switch; once all have, the future completes."""
        self.pending_frames -= 1
        if self.pending_frames == 0:
            self.progress = now
            if not self.future.done():
                self.future.set_result(None)


# a message below this may share a DATA frame with the messages queued after it on its channel (up to the switch's
# chunk_bytes in all): every hop's per-frame work (headers, checks, wake-ups, syscalls) is paid once per batch
BATCH_BELOW_BYTES = 256 * 1024
# the most a channel keeps on its way (sent, not yet received): beyond what the receiving worker's arena holds
# (64 MiB a direction by default), its switch would decrypt frames into its own memory and copy them again, and the
# more it works the further its worker falls behind. 32 MiB keeps a 100 ms round trip at 335 MB/s a channel.
TRANSIT_BYTES = 32 * 1024**2


@dataclass(eq=False, slots=True)
class OutBatch:
    """The messages one batch frame carries."""

    msgs: tuple[OutMessage, ...]
    share: Any = None  # (batched messages are small: never shared)

    def frame_sent(self, now: float) -> None:
        """The frame left for the switch: so did one frame of each of its messages."""
        for m in self.msgs:
            m.frame_sent(now)


class OutFrame(NamedTuple):
    """A frame waiting in a lane: head (header and meta), payload, and the message(s) it belongs to (if any)."""

    head: bytes
    payload: Any
    msg: OutMessage | OutBatch | None


def batches(msgs: list[OutMessage], chunk_bytes: int) -> list[list[OutMessage]]:
    """`msgs` (admitted in sequence order) cut into runs that may each travel as one frame: consecutive sequence
    numbers, one lane, each message below BATCH_BELOW_BYTES, at most chunk_bytes (with their table entries) and
    MAX_BATCH messages a run. Nothing waits for a batch to fill: a run holds only what is queued already."""
    out: list[list[OutMessage]] = []
    run: list[OutMessage] = []
    run_bytes = 0
    limit = min(BATCH_BELOW_BYTES, chunk_bytes)
    for m in msgs:
        n = len(m.data) + BATCH_ENTRY_BYTES * (2 + (len(m.parts) if m.parts is not None else 0))
        small = n <= limit
        if (run and small and m.seq == run[-1].seq + 1 and m.lane == run[0].lane and len(run) < MAX_BATCH
                and run_bytes + n <= chunk_bytes):
            run.append(m)
            run_bytes += n
            continue
        if run:
            out.append(run)
        run, run_bytes = [m], n
        if not small:
            out.append(run)
            run, run_bytes = [], 0
    if run:
        out.append(run)
    return out


class Admitted(NamedTuple):
    """A message the window let through and the receiver has not consumed yet (kept for a restarted receiver)."""

    seq: int
    nbytes: int
    msg: OutMessage


class Sender:
    """The sending half of one channel: numbers messages, admits them by window, frames, acknowledges, resends."""

    def __init__(self, key: ChannelKey, window_bytes: int, inc: int = 0, transit_bytes: int = TRANSIT_BYTES) -> None:
        self.key = key
        self.cid = key.id  # (a hash: computed once, not per frame)
        self.inc = inc  # this endpoint's incarnation
        self.peer_inc = 0  # the receiver's, once an acknowledgement named it
        self.meta = self._meta()
        self.batch_metas: dict[int, bytes] = {}  # by message count, for this meta
        self.window_bytes = window_bytes
        self.transit_bytes = transit_bytes
        self.next_seq = 1
        self.unacked: dict[int, OutMessage] = {}  # by seq, in order
        self.waiting: deque[OutMessage] = deque()  # not yet admitted by the window
        self.admitted: deque[Admitted] = deque()  # admitted and not yet consumed, in seq order
        self.inflight = 0  # bytes admitted and not yet consumed
        self.unreceived = 0  # bytes admitted and not yet received (acknowledged): in the switches, on their way
        self.admitted_upto = 0  # the highest seq admitted (admission goes in seq order)
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
            self.batch_metas.clear()
        return True

    def restart_stream(self) -> list[OutMessage]:
        """A new incarnation of the receiver announced itself: every message its predecessor had not consumed is
        numbered afresh from 1 (in order) and addressed to it; returns those the window lets through now."""
        self.relearn = False
        msgs = [a.msg for a in self.admitted] + list(self.waiting)
        self.unacked.clear()
        self.admitted.clear()
        self.waiting.clear()
        self.inflight = self.unreceived = self.admitted_upto = self.acked = self.consumed = 0
        self.next_seq = 1
        for msg in msgs:
            msg.seq = self.next_seq
            msg.batch = None  # (its span named the old numbers)
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
            if self.unreceived and self.unreceived + n > self.transit_bytes:
                break
            self.waiting.popleft()
            self.admitted.append(Admitted(msg.seq, n, msg))
            self.inflight += n
            self.unreceived += n
            self.admitted_upto = msg.seq
            out.append(msg)
        return out

    def frames(self, msg: OutMessage, chunk_bytes: int, now: float) -> list[OutFrame]:
        """The DATA frames of one (re)transmission of `msg`, in chunks of at most `chunk_bytes`."""
        total = len(msg.data)
        count = max(1, math.ceil(total / chunk_bytes))
        size = math.ceil(total / count) if total else 0
        out = []
        data = msg.data if count == 1 else memoryview(msg.data)  # (slices of a view, not copies)
        for i in range(count):
            payload = data[i * size : (i + 1) * size] if count > 1 else data
            meta = self.meta
            if i == 0 and msg.parts is not None:
                meta = encode_meta({**self.key.to_meta(), "inc": self.inc, "to": self.peer_inc, "parts": msg.parts})
            head = encode_frame(FrameType.DATA, meta, payload, lane=msg.lane, channel_id=self.cid, seq=msg.seq,
                                chunk_index=i, chunk_count=count, total_len=total)
            out.append(OutFrame(head, payload, msg))
        msg.pending_frames += count
        msg.batch = None
        msg.progress = now
        msg.sent_at = msg.sent_at or now
        # a large message may wait long behind others on a slow link: the fallback timer grows with its size
        msg.rto = max(msg.rto, RTO_S + total / RTO_BYTES_PER_S)
        return out

    def batch_frame(self, msgs: list[OutMessage], now: float) -> OutFrame:
        """One DATA frame carrying `msgs` (a run of `batches`, at least two): its payload is their table
        (`nebula.wire.batch`), then their bytes; its sequence number is the first one's."""
        k = len(msgs)
        meta = self.batch_metas.get(k)
        if meta is None:
            meta = self.batch_metas[k] = encode_meta({**self.key.to_meta(), "inc": self.inc, "to": self.peer_inc,
                                                      "batch": k})
        payload = Pieces([pack_table([(len(m.data), m.parts) for m in msgs]), *[m.data for m in msgs]])
        head = encode_frame(FrameType.DATA, meta, payload, lane=msgs[0].lane, channel_id=self.cid,
                            seq=msgs[0].seq, chunk_index=0, chunk_count=1, total_len=len(payload))
        span = (msgs[0].seq, k)
        for m in msgs:
            m.pending_frames += 1
            m.batch = span
            m.progress = now
            m.sent_at = m.sent_at or now
            m.rto = max(m.rto, RTO_S + len(m.data) / RTO_BYTES_PER_S)
        return OutFrame(head, payload, OutBatch(tuple(msgs)))

    def ack_refusal(self, recv_seq: int, consumed: int) -> str | None:
        """Why an acknowledgement cannot be true (it claims messages never sent, or more consumed than received),
        or None: the sender's own count bounds what an ACK may say, so a forged one costs nothing."""
        sent = self.admitted_upto  # (numbered messages the window still holds back have not left)
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
            # the link meter takes messages first sent together (one batch frame) as one delivery: they crossed
            # the link as one, and counting them apart would start its acknowledgement clock after a whole batch
            sent_at, nbytes = 0.0, 0
            for seq in range(self.acked + 1, recv_seq + 1):
                msg = self.unacked.pop(seq, None)
                if msg is None:
                    continue
                self.unreceived -= len(msg.data)  # (it was admitted: `ack_refusal` bounds recv_seq so)
                if not msg.future.done():
                    msg.future.set_result(None)
                if msg.sent_at != sent_at:
                    self._record(nbytes, sent_at, now)
                    sent_at, nbytes = msg.sent_at, 0
                nbytes += len(msg.data)
            self._record(nbytes, sent_at, now)
            self.acked = recv_seq
            progressed = True
        if consumed > self.consumed:
            self.consumed = consumed
            while self.admitted and self.admitted[0].seq <= consumed:
                self.inflight -= self.admitted.popleft().nbytes
        admitted = self._admit() if self.waiting else []  # (room by consumption, or by receipt)
        if progressed:
            # one time for all: stamping every unacknowledged message made each ACK cost O(messages in flight),
            # quadratic in a stream of small messages
            self.ack_progress = now
        return admitted

    def _record(self, nbytes: int, sent_at: float, now: float) -> None:
        if self.meter is not None and sent_at:
            self.meter.record(nbytes, sent_at, now)

    def on_refused(self, seq: int, err: ChannelError) -> list[OutMessage]:
        """The switch refused the frame of message `seq`: fail the message (and those that shared its batch
        frame, which a refusal names by its first), free their window shares; returns newly admitted."""
        msg = self.unacked.get(seq)
        if msg is None:
            return []
        first, count = msg.batch if msg.batch is not None and msg.batch[0] == seq else (seq, 1)
        mates = [m for m in map(self.unacked.get, range(first, first + count))
                 if m is not None and m.batch == msg.batch]
        for m in mates:
            del self.unacked[m.seq]
            for i, adm in enumerate(self.admitted):
                if adm.seq == m.seq:
                    del self.admitted[i]
                    self.inflight -= adm.nbytes
                    if m.seq > self.acked:
                        self.unreceived -= adm.nbytes
                    break
            if not m.future.done():
                m.future.set_exception(err)
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
