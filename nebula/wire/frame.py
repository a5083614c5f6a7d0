"""Frame layout, encoder and strict parser shared by workers, switches and peer links.

A frame is a fixed 52-byte big-endian header, a JSON object ("meta", at most MAX_META_BYTES) and an
opaque payload. Over ZeroMQ the header+meta and the payload are two parts of one multipart message;
over TLS they follow each other on the stream. Every field is checked before anything is allocated,
so a malformed or hostile frame costs the receiver nothing but a clear `WireError`.
"""
from __future__ import annotations

__all__ = [
    "HEADER_BYTES", "LANES", "LANE_LEVEL", "MAX_META_BYTES", "MAX_PAYLOAD_BYTES", "VERSION", "ChannelKey", "Frame",
    "FrameType", "Header", "Lane", "WireError", "channel_id", "decode_frame", "decode_head", "encode_frame",
    "encode_meta", "lane_of", "pack_header", "relink", "unpack_header",
]

import enum
import hashlib
import json
import struct
from dataclasses import dataclass
from typing import Any

VERSION = 1
MAGIC = b"NB"
# magic, version, type, lane, flags, meta_len, channel_id, seq, link_seq, chunk_index, chunk_count,
# payload_len, total_len
_HEADER = struct.Struct("!2sBBBBHQQQIIIQ")
HEADER_BYTES = _HEADER.size
MAX_META_BYTES = 8192
MAX_META_DEPTH = 16  # nesting of arrays/objects in meta: deeper input would exhaust the JSON parser's recursion
MAX_PAYLOAD_BYTES = 64 * 1024**2  # hard ceiling for one chunk; links use a smaller configured chunk size
MAX_TOTAL_BYTES = 1 << 44
MAX_NAME_CHARS = 256
MAX_CHUNKS = 1 << 31
MAX_PARTS = 512  # part lengths one DATA frame may list (Channel.send sends no part list beyond 500 parts)
MAX_OFFSETS = 4096  # shared-memory regions one SHM_RELEASE may hand back
INC_MAX = (1 << 63) - 1
# The fields each frame type's meta may carry; any other is refused, so that no frame can carry bytes the protocol
# does not define (an ACK's meta is not a side channel around route grants).
_KEY_FIELDS = frozenset({"job", "account", "src", "dst", "name"})
META_FIELDS: dict[int, frozenset[str]] = {
    1: frozenset({"job", "account", "name", "rank", "stages", "shm", "inc"}),  # HELLO
    2: frozenset({"boot", "cluster", "chunk_bytes", "max_message_bytes", "peers", "shm", "inc"}),  # WELCOME
    3: _KEY_FIELDS | {"inc", "to", "parts"},  # DATA
    4: _KEY_FIELDS | {"inc", "to", "consumed"},  # ACK
    5: frozenset({"code", "message", "channel"}),  # ERROR
    6: frozenset({"cluster", "epoch"}),  # LINK_HELLO
    7: frozenset({"cluster", "epoch", "resume", "credit"}),  # LINK_WELCOME
    8: frozenset({"credit"}),  # LINK_ACK
    9: frozenset({"checkpoint"}),  # CHECKPOINT
    10: frozenset({"t"}),  # PING
    11: frozenset({"t"}),  # PONG
    12: frozenset(),  # BYE
    13: frozenset({"token", "offsets"}),  # SHM_RELEASE
    14: frozenset({"job", "account", "rank", "inc"}),  # ENDED
}


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
    if isinstance(name, Lane):
        return name
    if isinstance(name, int) and not isinstance(name, bool) and 0 <= name < len(LANES):
        return Lane(name)
    if isinstance(name, str) and name in LANES:
        return Lane(LANES.index(name))
    raise ValueError(f"unknown lane {name!r}; use one of {', '.join(LANES)}")


@dataclass(frozen=True, slots=True)
class Header:
    """The fixed part of a frame."""

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


@dataclass(frozen=True, slots=True)
class ChannelKey:
    """Address of one ordered stream: (job, account, src cluster/rank, dst cluster/rank, name)."""

    job: str
    account: str
    src_cluster: str
    src_rank: int
    dst_cluster: str
    dst_rank: int
    name: str

    def to_meta(self) -> dict[str, Any]:
        """The key as meta fields."""
        return {
            "job": self.job,
            "account": self.account,
            "src": [self.src_cluster, self.src_rank],
            "dst": [self.dst_cluster, self.dst_rank],
            "name": self.name,
        }

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> ChannelKey:
        """Parse the key fields of a meta object; WireError names the bad field."""
        src = _endpoint(meta, "src")
        dst = _endpoint(meta, "dst")
        return cls(
            job=_name(meta, "job"),
            account=_name(meta, "account"),
            src_cluster=src[0],
            src_rank=src[1],
            dst_cluster=dst[0],
            dst_rank=dst[1],
            name=_name(meta, "name"),
        )

    @property
    def id(self) -> int:
        """64-bit id carried in every frame header of this channel."""
        return channel_id(self)


def channel_id(key: ChannelKey) -> int:
    """Stable 64-bit hash of a channel key."""
    text = "\x00".join(
        (key.job, key.account, key.src_cluster, str(key.src_rank), key.dst_cluster, str(key.dst_rank), key.name)
    )
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


@dataclass(frozen=True, slots=True)
class Frame:
    """A parsed frame: header, meta object and payload (bytes-like, possibly a view into a larger buffer)."""

    header: Header
    meta: dict[str, Any]
    payload: bytes | memoryview = b""

    @property
    def type(self) -> FrameType:
        return self.header.type

    def key(self) -> ChannelKey:
        """The channel key of a DATA or ACK frame (or an ERROR frame naming a channel)."""
        return ChannelKey.from_meta(self.meta if self.type != FrameType.ERROR else self.meta["channel"])


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
    try:
        ftype = FrameType(ftype)
    except ValueError:
        raise WireError("bad_type", f"unknown frame type {ftype}") from None
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
    if ftype != FrameType.DATA:
        if plen or count != 1 or total:
            raise WireError("bad_length", f"{ftype.name} frames carry no payload and no chunks")
    elif count == 1 and total != plen:
        raise WireError("bad_length", f"single-chunk message length {total} differs from its payload length {plen}")
    return Header(
        type=ftype, lane=Lane(lane), flags=flags, meta_len=meta_len, channel_id=chan, seq=seq, link_seq=link_seq,
        chunk_index=idx, chunk_count=count, payload_len=plen, total_len=total, version=version,
    )


def _parse_meta(h: Header, raw: bytes | memoryview) -> dict[str, Any]:
    if len(raw) != h.meta_len:
        raise WireError("truncated", f"meta needs {h.meta_len} bytes, got {len(raw)}")
    if not raw:
        meta: Any = {}
    else:
        raw = bytes(raw)
        if raw.count(b"[") + raw.count(b"{") > MAX_META_DEPTH and _nesting_depth(raw) > MAX_META_DEPTH:
            raise WireError("bad_meta", f"meta nests arrays/objects deeper than {MAX_META_DEPTH} levels; "
                                        "send a flat JSON object")
        try:
            meta = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise WireError("bad_meta", f"meta is not UTF-8 JSON: {exc}") from None
    if not isinstance(meta, dict):
        raise WireError("bad_meta", f"meta must be a JSON object, got {type(meta).__name__}")
    _check_meta(h, meta)
    return meta


def _nesting_depth(raw: bytes) -> int:
    """Deepest nesting of [ and { in JSON text `raw`, brackets inside strings not counted."""
    depth = deepest = 0
    in_str = escaped = False
    for c in raw:
        if in_str:
            if escaped:
                escaped = False
            elif c == 0x5C:  # backslash
                escaped = True
            elif c == 0x22:
                in_str = False
        elif c == 0x22:
            in_str = True
        elif c in (0x5B, 0x7B):
            depth += 1
            deepest = max(deepest, depth)
        elif c in (0x5D, 0x7D):
            depth -= 1
    return deepest


def decode_head(head: bytes | memoryview, *, max_payload_bytes: int = MAX_PAYLOAD_BYTES) -> tuple[Header, dict[str, Any]]:
    """Parse header+meta (the first ZeroMQ part); the payload follows separately."""
    h = unpack_header(head, max_payload_bytes=max_payload_bytes)
    if len(head) != HEADER_BYTES + h.meta_len:
        raise WireError(
            "truncated" if len(head) < HEADER_BYTES + h.meta_len else "trailing_bytes",
            f"header+meta part has {len(head)} bytes, header says {HEADER_BYTES + h.meta_len}",
        )
    return h, _parse_meta(h, memoryview(head)[HEADER_BYTES:])


def decode_frame(
    head: bytes | memoryview,
    payload: bytes | memoryview | None = None,
    *,
    max_payload_bytes: int = MAX_PAYLOAD_BYTES,
) -> Frame:
    """Parse a frame given as header+meta and payload, or (payload None) as one contiguous buffer."""
    if payload is None:
        view = memoryview(head)
        h = unpack_header(view, max_payload_bytes=max_payload_bytes)
        need = HEADER_BYTES + h.meta_len + h.payload_len
        if len(view) != need:
            raise WireError(
                "truncated" if len(view) < need else "trailing_bytes",
                f"frame has {len(view)} bytes, header says {need}",
            )
        meta = _parse_meta(h, view[HEADER_BYTES : HEADER_BYTES + h.meta_len])
        return Frame(h, meta, view[HEADER_BYTES + h.meta_len :])
    h, meta = decode_head(head, max_payload_bytes=max_payload_bytes)
    if len(payload) != h.payload_len:
        raise WireError(
            "truncated" if len(payload) < h.payload_len else "trailing_bytes",
            f"payload has {len(payload)} bytes, header says {h.payload_len}",
        )
    return Frame(h, meta, payload)


def encode_frame(
    ftype: FrameType,
    meta: dict[str, Any] | bytes | None = None,
    payload: bytes | memoryview = b"",
    *,
    lane: Lane = Lane.CONTROL,
    channel_id: int = 0,
    seq: int = 0,
    link_seq: int = 0,
    chunk_index: int = 0,
    chunk_count: int = 1,
    total_len: int | None = None,
) -> bytes:
    """Encode header+meta; the payload (not copied) is sent after it. `meta` may be pre-encoded JSON bytes."""
    raw = meta if isinstance(meta, bytes) else encode_meta(meta or {})
    plen = len(payload)
    h = Header(
        type=ftype, lane=lane, meta_len=len(raw), channel_id=channel_id, seq=seq, link_seq=link_seq,
        chunk_index=chunk_index, chunk_count=chunk_count, payload_len=plen,
        total_len=plen if total_len is None else total_len,
    )
    return pack_header(h) + raw


def encode_meta(meta: dict[str, Any]) -> bytes:
    """Compact JSON for a meta object; ValueError if it exceeds MAX_META_BYTES."""
    raw = json.dumps(meta, separators=(",", ":")).encode()
    if len(raw) > MAX_META_BYTES:
        raise ValueError(f"meta of {len(raw)} bytes exceeds {MAX_META_BYTES}; shorten names")
    return raw


def relink(head: bytes | bytearray, link_seq: int) -> bytes:
    """Copy of an encoded header+meta with its link sequence number replaced (cheap: no re-parse)."""
    buf = bytearray(head)
    struct.pack_into("!Q", buf, _LINK_SEQ_OFFSET, link_seq)
    return bytes(buf)


_LINK_SEQ_OFFSET = struct.calcsize("!2sBBBBHQQ")


# ---- meta schemas: every type's required fields and their kinds ----

def _name(meta: dict[str, Any], field: str) -> str:
    v = meta.get(field)
    if not isinstance(v, str) or not v or len(v) > MAX_NAME_CHARS:
        raise WireError("bad_meta", f"meta field {field!r} must be a non-empty string of at most {MAX_NAME_CHARS} characters, got {v!r}")
    return v


def _int(meta: dict[str, Any], field: str, lo: int = 0, hi: int = (1 << 63) - 1) -> int:
    v = meta.get(field)
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise WireError("bad_meta", f"meta field {field!r} must be an integer in [{lo}, {hi}], got {v!r}")
    return v


def _endpoint(meta: dict[str, Any], field: str) -> tuple[str, int]:
    v = meta.get(field)
    if (
        not isinstance(v, list)
        or len(v) != 2
        or not isinstance(v[0], str)
        or not v[0]
        or len(v[0]) > MAX_NAME_CHARS
        or not isinstance(v[1], int)
        or isinstance(v[1], bool)
        or not 0 <= v[1] < (1 << 31)
    ):
        raise WireError("bad_meta", f"meta field {field!r} must be [cluster, rank], got {v!r}")
    return v[0], v[1]


def _stage_map(v: Any) -> None:
    """HELLO's optional `stages`: the job file's stage -> cluster map, names as on the wire."""
    if not isinstance(v, dict) or not all(isinstance(k, str) and k and len(k) <= MAX_NAME_CHARS and isinstance(c, str)
                                          and c and len(c) <= MAX_NAME_CHARS for k, c in v.items()):
        raise WireError("bad_meta", f"HELLO meta 'stages' must map stage names to cluster names, got {v!r}"[:400])


def _check_meta(h: Header, meta: dict[str, Any]) -> None:
    t = h.type
    extra = meta.keys() - META_FIELDS[t]
    if extra:
        names = ", ".join(repr(k[:40]) for k in sorted(extra)[:5])
        raise WireError("bad_meta", f"{t.name} meta carries field(s) {names} that the protocol does not define; "
                                    f"{t.name} meta may carry only {', '.join(sorted(META_FIELDS[t])) or 'nothing'}")
    if t == FrameType.HELLO:
        _name(meta, "job"), _name(meta, "account"), _name(meta, "name"), _int(meta, "rank", 0, (1 << 31) - 1)
        if "stages" in meta:
            _stage_map(meta["stages"])
        if "inc" in meta:
            _int(meta, "inc", 0, INC_MAX)
        if "shm" in meta:
            _int(meta, "shm", 0, INC_MAX)
    elif t in (FrameType.DATA, FrameType.ACK):
        key = ChannelKey.from_meta(meta)
        if h.channel_id != channel_id(key):
            raise WireError("bad_channel", f"header channel id {h.channel_id:#x} does not match the channel key in meta")
        for field in ("inc", "to"):  # incarnations (nebula.channel.delivery); absent = 0
            if field in meta:
                _int(meta, field, 0, INC_MAX)
        if t == FrameType.ACK:
            if _int(meta, "consumed") > h.seq:
                raise WireError("bad_meta", f"ACK says {meta['consumed']} messages were consumed of the {h.seq} "
                                            "received: a receiver cannot consume more than it has")
        elif "parts" in meta:
            parts = meta["parts"]
            if (
                h.chunk_index != 0
                or not isinstance(parts, list)
                or len(parts) > MAX_PARTS
                or not all(isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in parts)
                or sum(parts) != h.total_len
            ):
                raise WireError("bad_meta", f"meta 'parts' must be at most {MAX_PARTS} part lengths summing to the "
                                            "message length, on chunk 0")
    elif t == FrameType.ERROR:
        _name(meta, "code")
        if not isinstance(meta.get("message"), str):
            raise WireError("bad_meta", "ERROR meta needs a string 'message'")
        if meta.get("channel") is not None:
            if not isinstance(meta["channel"], dict):
                raise WireError("bad_meta", "ERROR meta 'channel' must be an object")
            extra = meta["channel"].keys() - _KEY_FIELDS
            if extra:
                raise WireError("bad_meta", "ERROR meta 'channel' may hold only job, account, src, dst and name")
            ChannelKey.from_meta(meta["channel"])
    elif t == FrameType.LINK_HELLO:
        _name(meta, "cluster"), _int(meta, "epoch", 0, (1 << 31) - 1)
    elif t == FrameType.LINK_WELCOME:
        _name(meta, "cluster"), _int(meta, "epoch", 0, (1 << 31) - 1), _int(meta, "resume"), _int(meta, "credit")
    elif t == FrameType.LINK_ACK:
        _int(meta, "credit")
    elif t == FrameType.CHECKPOINT:
        if not isinstance(meta.get("checkpoint"), str):
            raise WireError("bad_meta", "CHECKPOINT meta needs a string 'checkpoint'")
    elif t in (FrameType.PING, FrameType.PONG):
        if not isinstance(meta.get("t"), (int, float)) or isinstance(meta.get("t"), bool):
            raise WireError("bad_meta", f"{t.name} meta needs a number 't'")
    elif t == FrameType.SHM_RELEASE:
        _int(meta, "token")
        offsets = meta.get("offsets")
        if (not isinstance(offsets, list) or len(offsets) > MAX_OFFSETS
                or not all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offsets)):
            raise WireError("bad_meta", f"SHM_RELEASE meta needs 'offsets', a list of at most {MAX_OFFSETS} "
                                        "non-negative integers")
    elif t == FrameType.WELCOME:
        _int(meta, "boot"), _int(meta, "chunk_bytes", 1), _int(meta, "max_message_bytes", 1)
        if "inc" in meta:
            _int(meta, "inc", 1, INC_MAX)
        if not isinstance(meta.get("peers"), dict):
            raise WireError("bad_meta", "WELCOME meta needs an object 'peers'")
    elif t == FrameType.ENDED:
        _name(meta, "job"), _name(meta, "account"), _int(meta, "rank", 0, (1 << 31) - 1), _int(meta, "inc", 1, INC_MAX)
