"""Frame meta: the JSON object after the header, checked field by field against its frame type's schema, and the
channel key DATA and ACK frames carry in it.

DATA and ACK frames of one channel carry the same meta bytes frame after frame, so their parsed meta is kept
(keyed by those bytes, bounded): a repeat costs a dictionary look-up and the checks that involve the header, not a
JSON parse and a key hash. A meta dict handed out is shared between frames: read it, never change it.
"""
from __future__ import annotations

__all__ = ["INC_MAX", "MAX_META_BYTES", "MAX_META_DEPTH", "MAX_NAME_CHARS", "MAX_OFFSETS", "MAX_PARTS",
           "META_FIELDS", "ChannelKey", "channel_id", "encode_meta", "parse_meta"]

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from nebula.wire.batch import min_table_bytes
from nebula.wire.header import MAX_BATCH, MAX_META_BYTES, MAX_PARTS, FrameType, Header, WireError

MAX_META_DEPTH = 16  # nesting of arrays/objects in meta: deeper input would exhaust the JSON parser's recursion
MAX_NAME_CHARS = 256
MAX_OFFSETS = 4096  # shared-memory regions one SHM_RELEASE may hand back
INC_MAX = (1 << 63) - 1
# The fields each frame type's meta may carry; any other is refused, so that no frame can carry bytes the protocol
# does not define (an ACK's meta is not a side channel around route grants).
_KEY_FIELDS = frozenset({"job", "account", "src", "dst", "name"})
META_FIELDS: dict[int, frozenset[str]] = {
    1: frozenset({"job", "account", "name", "rank", "stages", "shm", "inc"}),  # HELLO
    2: frozenset({"boot", "cluster", "chunk_bytes", "max_message_bytes", "peers", "shm", "inc"}),  # WELCOME
    3: _KEY_FIELDS | {"inc", "to", "parts", "batch"},  # DATA
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


# parsed DATA/ACK metas by (type, meta bytes): entries and the size of a meta kept are bounded, so a peer that sends
# ever new metas costs what it did without the cache
_CACHE_ENTRIES = 4096
_CACHE_META_BYTES = 512
_cache: dict[tuple[FrameType, bytes], tuple[dict[str, Any], ChannelKey, int]] = {}


def parse_meta(h: Header, raw: bytes | memoryview) -> tuple[dict[str, Any], ChannelKey | None]:
    """The meta object of a frame with header `h`, checked against its type's schema, and its channel key (DATA and
    ACK frames; else None); WireError names what is wrong."""
    if len(raw) != h.meta_len:
        raise WireError("truncated", f"meta needs {h.meta_len} bytes, got {len(raw)}")
    t = h.type
    if t is FrameType.DATA or t is FrameType.ACK:
        raw = bytes(raw)
        hit = _cache.get((t, raw))
        if hit is not None:
            meta, key, cid = hit
            _check_with_header(h, meta, cid)
            return meta, key
        meta = _load(raw)
        key = _check_keyed(h, meta)
        if len(raw) <= _CACHE_META_BYTES:
            if len(_cache) >= _CACHE_ENTRIES:
                _cache.clear()
            _cache[(t, raw)] = (meta, key, h.channel_id)
        return meta, key
    meta = _load(raw)
    _check_meta(h, meta)
    return meta, None


def _load(raw: bytes | memoryview) -> dict[str, Any]:
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


def encode_meta(meta: dict[str, Any]) -> bytes:
    """Compact JSON for a meta object; ValueError if it exceeds MAX_META_BYTES."""
    raw = json.dumps(meta, separators=(",", ":")).encode()
    if len(raw) > MAX_META_BYTES:
        raise ValueError(f"meta of {len(raw)} bytes exceeds {MAX_META_BYTES}; shorten names")
    return raw


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


def _extra(t: FrameType, meta: dict[str, Any]) -> None:
    extra = meta.keys() - META_FIELDS[t]
    if extra:
        names = ", ".join(repr(k[:40]) for k in sorted(extra)[:5])
        raise WireError("bad_meta", f"{t.name} meta carries field(s) {names} that the protocol does not define; "
                                    f"{t.name} meta may carry only {', '.join(sorted(META_FIELDS[t])) or 'nothing'}")


def _check_keyed(h: Header, meta: dict[str, Any]) -> ChannelKey:
    """Check a DATA or ACK meta; its channel key."""
    _extra(h.type, meta)
    key = ChannelKey.from_meta(meta)
    for field in ("inc", "to"):  # incarnations (nebula.channel.delivery); absent = 0
        if field in meta:
            _int(meta, field, 0, INC_MAX)
    if h.type == FrameType.ACK:
        _int(meta, "consumed")
    elif "batch" in meta:
        _int(meta, "batch", 2, MAX_BATCH)
        if "parts" in meta:
            raise WireError("bad_meta", "a DATA frame carries either 'parts' (one message's part lengths) or "
                                        "'batch' (several whole messages), not both")
    elif "parts" in meta:
        parts = meta["parts"]
        if (not isinstance(parts, list) or len(parts) > MAX_PARTS
                or not all(isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in parts)):
            raise WireError("bad_meta", f"meta 'parts' must be at most {MAX_PARTS} part lengths summing to the "
                                        "message length, on chunk 0")
    _check_with_header(h, meta, channel_id(key))
    return key


def _check_with_header(h: Header, meta: dict[str, Any], cid: int) -> None:
    """The checks of a DATA or ACK meta that involve its header (made again for every frame)."""
    if h.channel_id != cid:
        raise WireError("bad_channel", f"header channel id {h.channel_id:#x} does not match the channel key in meta")
    if h.type == FrameType.ACK:
        if meta["consumed"] > h.seq:
            raise WireError("bad_meta", f"ACK says {meta['consumed']} messages were consumed of the {h.seq} "
                                        "received: a receiver cannot consume more than it has")
    elif "batch" in meta:
        if h.chunk_count != 1 or h.total_len < min_table_bytes(meta["batch"]):
            raise WireError("bad_meta", f"a DATA frame of a batch of {meta['batch']} messages must be one chunk "
                                        f"opening with their table (nebula.wire.batch); it declares "
                                        f"{h.chunk_count} chunks of {h.total_len} bytes")
    elif "parts" in meta and (h.chunk_index != 0 or sum(meta["parts"]) != h.total_len):
        raise WireError("bad_meta", f"meta 'parts' must be at most {MAX_PARTS} part lengths summing to the "
                                    "message length, on chunk 0")


def _check_meta(h: Header, meta: dict[str, Any]) -> None:
    t = h.type
    if t in (FrameType.DATA, FrameType.ACK):
        _check_keyed(h, meta)
        return
    _extra(t, meta)
    if t == FrameType.HELLO:
        _name(meta, "job"), _name(meta, "account"), _name(meta, "name"), _int(meta, "rank", 0, (1 << 31) - 1)
        if "stages" in meta:
            _stage_map(meta["stages"])
        if "inc" in meta:
            _int(meta, "inc", 0, INC_MAX)
        if "shm" in meta:
            _int(meta, "shm", 0, INC_MAX)
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
