"""nebula.wire.stream: messages of parts cut anywhere by the stream come out whole, in order; what breaks the
framing or a receiver's bound ends the stream before its bytes are read."""
from __future__ import annotations

import random
import struct

import pytest

from nebula.wire.stream import JOIN_BELOW_BYTES, MAX_PARTS, MessageParser, StreamError, frame_parts, tls_writes


def _feed(parser: MessageParser, data: bytes, rng: random.Random) -> list[list[bytes]]:
    out, at = [], 0
    while at < len(data):
        buf = parser.buffer()
        n = min(len(buf), rng.choice([1, 3, 100, 4096, 70_000]), len(data) - at)
        buf[:n] = data[at : at + n]
        at += n
        out += [[bytes(p) for p in msg] for msg in parser.taken(n)]
    return out


def test_messages_cut_anywhere_come_out_whole_and_in_order():
    rng = random.Random(5)
    msgs = [[rng.randbytes(rng.choice([0, 1, 24, 5000, 300_000])) for _ in range(rng.randint(1, MAX_PARTS))]
            for _ in range(60)]
    stream = b"".join(bytes(piece) for m in msgs for piece in frame_parts(m))
    parser = MessageParser(max_bytes=4 * 300_000, staging_bytes=64 * 1024)  # messages larger than its buffer
    assert _feed(parser, stream, rng) == msgs


def test_a_message_over_the_bound_or_misframed_ends_the_stream_before_it_is_read():
    parser = MessageParser(max_bytes=1000)
    buf = parser.buffer()
    head = struct.pack(">IB", 1_000_000, 1)  # 1 MB announced: refused from its head alone
    buf[: len(head)] = head
    with pytest.raises(StreamError, match="at most 4 parts and 1000 bytes"):
        parser.taken(len(head))
    for bad, why in ((struct.pack(">IB", 3, 0), "0 parts"), (struct.pack(">IB", 3, 9), "9 parts"),
                     (struct.pack(">IB2I", 3, 2, 1, 1) + b"abc", "do not add up")):
        parser = MessageParser(max_bytes=1000)
        parser.buffer()[: len(bad)] = bad
        with pytest.raises(StreamError, match=why):
            parser.taken(len(bad))
    with pytest.raises(StreamError, match="1 to 4 parts"):
        frame_parts([])


@pytest.mark.parametrize("sizes", [[5, 40], [5, 40, 300_000], [300_000, 9, 12, 300_000, 3], [JOIN_BELOW_BYTES] * 3,
                                   [10, JOIN_BELOW_BYTES - 20, 70_000]])
def test_tls_writes_keep_the_bytes_and_join_what_is_small(sizes):
    """Regrouped for TLS, a message's pieces carry the same bytes in the same order; no write is a small piece on
    its own unless it is the last, and a large piece is copied at most for the first record's worth."""
    rng = random.Random(len(sizes))
    pieces = [rng.randbytes(n) for n in sizes]
    writes = tls_writes(pieces)
    assert b"".join(bytes(w) for w in writes) == b"".join(pieces)
    assert all(len(w) >= JOIN_BELOW_BYTES for w in writes[:-1]) or len(writes) == 1
    copied = [w for w in writes if isinstance(w, bytes) and not any(w is p for p in pieces)]  # (joins, not views)
    assert sum(len(w) for w in copied) <= len(sizes) * JOIN_BELOW_BYTES
