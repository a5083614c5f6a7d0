"""The fixed 52-byte big-endian frame header every hop speaks, its types and lanes, and its strict parser.

Every field is checked before anything is allocated, so a malformed or hostile header costs the receiver nothing but
a clear `WireError`.
"""
from __future__ import annotations

__all__ = [
    "HEADER_BYTES", "LANES", "LANE_LEVEL", "MAX_CHUNKS", "MAX_PAYLOAD_BYTES", "MAX_TOTAL_BYTES", "VERSION",
    "FrameType", "Header", "Lane", "WireError", "chunk_of", "lane_of", "pack_header", "relink", "unpack_header",
]

import enum
import struct
from typing import NamedTuple

VERSION = 1
MAGIC = b"NB"
# magic, version, type, lane, flags, meta_len, channel_id, seq, link_seq, chunk_index, chunk_count,
# payload_len, total_len
_HEADER = struct.Struct("!2sBBBBHQQQIIIQ")
HEADER_BYTES = _HEADER.size
MAX_PAYLOAD_BYTES = 64 * 1024**2  # hard ceiling for one chunk; links use a smaller configured chunk size
MAX_TOTAL_BYTES = 1 << 44
MAX_CHUNKS = 1 << 31
MAX_META_BYTES = 8192
MAX_PARTS = 512  # part lengths one message may list (Channel.send sends no part list beyond 500 parts)
MAX_BATCH = 256  # messages one batch frame may carry (nebula.wire.batch)


class WireError(ValueError):
    """A frame does not follow the wire format; `code` is a short machine-readable reason."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class FrameType(enum.IntEnum):
    """What a frame carries."""

    HELLO = 1  # worker -> switch: job, rank, account, name, optionally the job's stage map (also the heartbeat)
    WELCOME = 2  # switch -> worker: boot epoch, limits, peer link states
    DATA = 3  # one chunk of a channel message
    ACK = 4  # receiving worker -> sending worker: cumulative received and consumed sequence numbers
    ERROR = 5  # a refusal with a reason code and text
    LINK_HELLO = 6  # dialing switch -> accepting switch after TLS: cluster, epoch
    LINK_WELCOME = 7  # accepting switch -> dialing switch: cluster, epoch, resume point, credit
    LINK_ACK = 8  # accepting switch -> dialing switch: cumulative link sequence number and credit
    CHECKPOINT = 9  # signed audit checkpoint of the sender's log
    PING = 10
    PONG = 11
    BYE = 12  # worker -> switch: this connection is closing, its rank is free at once; the switch answers BYE
    SHM_RELEASE = 13  # worker <-> switch on one host: shared-memory regions the sender is done with (nebula.wire.shm)
    ENDED = 14  # switch -> peer switch: an incarnation of one of its ranks has ended (its held messages expire)


class Lane(enum.IntEnum):
    """Priority class on a peer link; lower value is served first (activation and gradient share a level)."""

    CONTROL = 0
    ACTIVATION = 1
    GRADIENT = 2
    BULK = 3


LANES = ("control", "activation", "gradient", "bulk")
# scheduling level of each lane: activation and gradient are equal
LANE_LEVEL = (0, 1, 1, 2)


def lane_of(name: str | Lane | int) -> Lane:
    """Lane by name (`control`, `activation`, `gradient`, `bulk`) or number; ValueError names the choices."""
    if name.__class__ is str:  # (every send names its lane: one look-up, not an enum construction)
        lane = _LANE_BY_NAME.get(name)
        if lane is not None:
            return lane
    if isinstance(name, Lane):
        return name
    if isinstance(name, int) and not isinstance(name, bool) and 0 <= name < len(LANES):
        return Lane(name)
    if isinstance(name, str) and name in LANES:
        return Lane(LANES.index(name))
    raise ValueError(f"unknown lane {name!r}; use one of {', '.join(LANES)}")


_LANE_BY_NAME = {name: Lane(i) for i, name in enumerate(LANES)}


class Header(NamedTuple):
    """The fixed part of a frame (a tuple: the parser builds one per frame on every hop)."""

    type: FrameType
    lane: Lane = Lane.CONTROL
    flags: int = 0
    meta_len: int = 0
    channel_id: int = 0
    seq: int = 0  # channel message sequence number (DATA, ERROR) or cumulative received seq (ACK)
    link_seq: int = 0  # peer-link sequence number, set by the sending switch
    chunk_index: int = 0
    chunk_count: int = 1
    payload_len: int = 0
    total_len: int = 0  # bytes of the whole message this chunk belongs to
    version: int = VERSION


_TYPES = {int(t): t for t in FrameType}
_LANE_OF = tuple(Lane)
_KNOWN_FLAGS = 0  # no flags defined in version 1; any set bit is refused


def pack_header(h: Header) -> bytes:
    """Encode a header; ValueError if a field does not fit."""
    try:
        return _HEADER.pack(
            MAGIC, h.version, int(h.type), int(h.lane), h.flags, h.meta_len, h.channel_id, h.seq, h.link_seq,
            h.chunk_index, h.chunk_count, h.payload_len, h.total_len,
        )
    except struct.error as exc:
        raise ValueError(f"header field out of range: {exc} in {h}") from exc


def unpack_header(buf: bytes | bytearray | memoryview, *, max_payload_bytes: int = MAX_PAYLOAD_BYTES) -> Header:
    """Parse and check the fixed header at the start of `buf`; raise WireError with a reason code."""
    if len(buf) < HEADER_BYTES:
        raise WireError("truncated", f"frame header needs {HEADER_BYTES} bytes, got {len(buf)}")
    (magic, version, ftype, lane, flags, meta_len, chan, seq, link_seq, idx, count, plen, total) = _HEADER.unpack_from(
        buf, 0
    )
    if magic != MAGIC:
        raise WireError(
            "bad_magic",
            f"not a Nebula frame (starts with {bytes(buf[:2])!r}, expected {MAGIC!r}); "
            "the sender speaks another protocol",
        )
    if version != VERSION:
        raise WireError("bad_version", f"wire version {version} is not supported (this side speaks {VERSION}); upgrade")
    t = _TYPES.get(ftype)
    if t is None:
        raise WireError("bad_type", f"unknown frame type {ftype}")
    if lane >= len(LANES):
        raise WireError("bad_lane", f"unknown lane {lane}; lanes are 0..{len(LANES) - 1} ({', '.join(LANES)})")
    if flags & ~_KNOWN_FLAGS:
        raise WireError("bad_flags", f"unknown flag bits {flags:#x}")
    if meta_len > MAX_META_BYTES:
        raise WireError("meta_too_large", f"meta of {meta_len} bytes exceeds {MAX_META_BYTES}")
    if plen > max_payload_bytes:
        raise WireError(
            "chunk_too_large", f"chunk payload of {plen} bytes exceeds the limit of {max_payload_bytes}; send smaller chunks"
        )
    if count < 1 or count > MAX_CHUNKS:
        raise WireError("bad_chunk", f"chunk count {count} must be between 1 and {MAX_CHUNKS}")
    if idx >= count:
        raise WireError("bad_chunk", f"chunk index {idx} is not below chunk count {count}")
    if total > MAX_TOTAL_BYTES or total < plen:
        raise WireError("bad_length", f"message length {total} is smaller than its chunk ({plen}) or too large")
    if t is not FrameType.DATA:
        if plen or count != 1 or total:
            raise WireError("bad_length", f"{t.name} frames carry no payload and no chunks")
    elif count == 1 and total != plen:
        raise WireError("bad_length", f"single-chunk message length {total} differs from its payload length {plen}")
    return Header(t, _LANE_OF[lane], flags, meta_len, chan, seq, link_seq, idx, count, plen, total, version)


def relink(head: bytes | bytearray, link_seq: int) -> bytes:
    """Copy of an encoded header+meta with its link sequence number replaced (cheap: no re-parse)."""
    buf = bytearray(head)
    struct.pack_into("!Q", buf, _LINK_SEQ_OFFSET, link_seq)
    return bytes(buf)


def chunk_of(head: bytes | bytearray | memoryview) -> int:
    """The chunk index of an encoded header (which of its message's chunks a frame carries)."""
    return struct.unpack_from("!I", head, _CHUNK_OFFSET)[0]


_LINK_SEQ_OFFSET = struct.calcsize("!2sBBBBHQQ")
_CHUNK_OFFSET = struct.calcsize("!2sBBBBHQQQ")
