"""Frames: a fixed header (`nebula.wire.header`), a JSON meta object (`nebula.wire.meta`, at most MAX_META_BYTES)
and an opaque payload; the encoder, and the strict parser shared by workers, switches and peer links.

Over ZeroMQ the header+meta and the payload are two parts of one multipart message; over TLS they follow each other
on the stream. Every field is checked before anything is allocated, so a malformed or hostile frame costs the
receiver nothing but a clear `WireError`.
"""
from __future__ import annotations

__all__ = [
    "HEADER_BYTES", "LANES", "LANE_LEVEL", "MAX_META_BYTES", "MAX_PAYLOAD_BYTES", "VERSION", "ChannelKey", "Frame",
    "FrameType", "Header", "Lane", "WireError", "channel_id", "decode_frame", "decode_head", "encode_frame",
    "encode_meta", "head_frame", "lane_of", "pack_header", "relink", "unpack_header",
]

from dataclasses import dataclass
from typing import Any, Sized

from nebula.wire.header import (HEADER_BYTES, LANE_LEVEL, LANES, MAX_META_BYTES, MAX_PAYLOAD_BYTES, VERSION, FrameType,
                                Header, Lane, WireError, lane_of, pack_header, relink, unpack_header)
from nebula.wire.meta import ChannelKey, channel_id, encode_meta, parse_meta


@dataclass(frozen=True, slots=True)
class Frame:
    """A parsed frame: header, meta object (shared, read-only) and payload (bytes-like, possibly a view into a
    larger buffer); `ckey`: the channel key of a DATA or ACK frame, as parsed."""

    header: Header
    meta: dict[str, Any]
    payload: bytes | memoryview = b""
    ckey: ChannelKey | None = None

    @property
    def type(self) -> FrameType:
        return self.header.type

    @property
    def last_seq(self) -> int:
        """The highest message number the frame carries: a batch frame's (its meta's `batch`) runs from its
        header's sequence number on; any other frame's is that number."""
        return self.header.seq + self.meta.get("batch", 1) - 1

    def key(self) -> ChannelKey:
        """The channel key of a DATA or ACK frame (or an ERROR frame naming a channel)."""
        if self.ckey is not None:
            return self.ckey
        return ChannelKey.from_meta(self.meta if self.type != FrameType.ERROR else self.meta["channel"])


def decode_head(head: bytes | memoryview, *, max_payload_bytes: int = MAX_PAYLOAD_BYTES) -> tuple[Header, dict[str, Any]]:
    """Parse header+meta (the first ZeroMQ part); the payload follows separately."""
    h, meta, _ = _head(head, max_payload_bytes)
    return h, meta


def head_frame(head: bytes | memoryview, *, max_payload_bytes: int = MAX_PAYLOAD_BYTES) -> Frame:
    """Header+meta parsed as a Frame without its payload (a frame whose payload is still being read); give it its
    payload with `dataclasses.replace` once that is in."""
    h, meta, key = _head(head, max_payload_bytes)
    return Frame(h, meta, b"", key)


def _head(head: bytes | memoryview, max_payload_bytes: int) -> tuple[Header, dict[str, Any], ChannelKey | None]:
    h = unpack_header(head, max_payload_bytes=max_payload_bytes)
    if len(head) != HEADER_BYTES + h.meta_len:
        raise WireError(
            "truncated" if len(head) < HEADER_BYTES + h.meta_len else "trailing_bytes",
            f"header+meta part has {len(head)} bytes, header says {HEADER_BYTES + h.meta_len}",
        )
    meta, key = parse_meta(h, memoryview(head)[HEADER_BYTES:])
    return h, meta, key


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
        meta, key = parse_meta(h, view[HEADER_BYTES : HEADER_BYTES + h.meta_len])
        return Frame(h, meta, view[HEADER_BYTES + h.meta_len :], key)
    h, meta, key = _head(head, max_payload_bytes)
    if len(payload) != h.payload_len:
        raise WireError(
            "truncated" if len(payload) < h.payload_len else "trailing_bytes",
            f"payload has {len(payload)} bytes, header says {h.payload_len}",
        )
    return Frame(h, meta, payload, key)


def encode_frame(
    ftype: FrameType,
    meta: dict[str, Any] | bytes | None = None,
    payload: Sized = b"",
    *,
    lane: Lane = Lane.CONTROL,
    channel_id: int = 0,
    seq: int = 0,
    link_seq: int = 0,
    chunk_index: int = 0,
    chunk_count: int = 1,
    total_len: int | None = None,
) -> bytes:
    """Encode header+meta; the payload (only its length is read: it is sent after) follows. `meta` may be
    pre-encoded JSON bytes."""
    raw = meta if isinstance(meta, bytes) else encode_meta(meta or {})
    plen = len(payload)
    h = Header(ftype, lane, 0, len(raw), channel_id, seq, link_seq, chunk_index, chunk_count, plen,
               plen if total_len is None else total_len)
    return pack_header(h) + raw
