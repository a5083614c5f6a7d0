"""The receiving half of a channel as pure state (see `nebula.channel.delivery` for the protocol): duplicates
dropped, chunks reassembled, messages delivered in order and exactly once, incarnations of both ends checked."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from nebula.channel.errors import ChannelError
from nebula.wire import ChannelKey, Header, WireError
from nebula.wire.batch import unpack_table

__all__ = ["MAX_AHEAD", "Delivered", "Reassembly", "Outcome", "Receiver"]

# messages a receiver keeps ahead of the next one it delivers (complete or partial): a sender's window keeps a
# behaving sender far below this; a forged sequence number far ahead is dropped instead of held for ever
MAX_AHEAD = 1 << 16


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
        if meta is not None and "batch" in meta:
            return self._on_batch(h, payload, meta["batch"], max_message_bytes, region, out)
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

    def _on_batch(self, h: Header, payload: Any, k: int, limit: int, region: Any, out: Outcome) -> Outcome:
        """A frame carrying messages h.seq .. h.seq+k-1 whole (`nebula.wire.batch`): each is taken as a one-chunk
        message would be. A table that does not describe the payload exactly refuses all k, each in its place."""
        if region is not None:
            out.release.append(region)  # (each message is copied out below)
        view = memoryview(payload)
        try:
            lengths, parts, off = unpack_table(view, k)
            bad = None
        except WireError as exc:
            lengths, parts, off, bad = [0] * k, [None] * k, 0, str(exc)
        for i in range(k):
            seq, n = h.seq + i, lengths[i]
            data, off = view[off : off + n], off + n
            if seq < self.expected or seq in self.complete:
                out.ack = True  # a duplicate: acknowledged again, delivered once
                continue
            if seq - self.expected >= MAX_AHEAD:
                self.ahead += 1
                continue
            partial = self.partial.pop(seq, None)  # (an earlier transmission in chunks: this one is whole)
            if partial is not None:
                out.release.extend(partial.regions)
            if bad is not None:
                self._refuse(seq, f"it came in a batch of {k} whose table is unsound ({bad}), so the frame is "
                                  "corrupt or forged", out, None)
            elif n > limit:
                self._refuse(seq, f"it declares {n} bytes, more than link.max_message_bytes={limit} of this "
                                  "cluster's switch", out, None)
            else:
                self._complete(seq, Delivered(bytes(data), parts[i]), out)
        return out

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
