"""The payload of a batch frame (a DATA frame whose meta's `batch` is k, 2 <= k <= MAX_BATCH): k whole consecutive
messages of one channel behind a table, 4-byte big-endian entries: their k lengths, their k part counts (0: sent as
one part), then the part lengths of those that have parts, in order; then the messages' bytes.
`nebula.channel.sender.batches` says which messages share a frame."""
from __future__ import annotations

__all__ = ["BATCH_ENTRY_BYTES", "MAX_BATCH", "min_table_bytes", "pack_table", "table_refusal", "unpack_table"]


import struct
from typing import Any, Sequence

from nebula.wire.header import MAX_BATCH, MAX_PARTS, WireError

BATCH_ENTRY_BYTES = 4


def min_table_bytes(k: int) -> int:
    """The smallest table of a batch of `k` messages (lengths and part counts, no part lengths)."""
    return 2 * k * BATCH_ENTRY_BYTES


def pack_table(messages: Sequence[tuple[int, Sequence[int] | None]]) -> bytes:
    """The table of messages given as (length, part lengths or None)."""
    lengths = [n for n, _ in messages]
    counts = [len(p) if p is not None else 0 for _, p in messages]
    flat = [x for _, p in messages if p is not None for x in p]
    return struct.pack(f">{len(lengths) + len(counts) + len(flat)}I", *lengths, *counts, *flat)


def unpack_table(payload: Any, k: int) -> tuple[list[int], list[list[int] | None], int]:
    """(lengths, part lists or None, table bytes) of a batch of `k`; WireError when the table does not describe
    the payload exactly: every part list summing to its message, every message's bytes there, nothing after."""
    view = memoryview(payload)
    head = min_table_bytes(k)
    if len(view) < head:
        raise WireError("bad_batch", f"a batch of {k} needs a table of at least {head} bytes; the frame has {len(view)}")
    fields = struct.unpack_from(f">{2 * k}I", view)
    lengths, counts = list(fields[:k]), fields[k:]
    if any(c > MAX_PARTS for c in counts):
        raise WireError("bad_batch", f"a message of the batch lists more than {MAX_PARTS} parts")
    table = head + BATCH_ENTRY_BYTES * sum(counts)
    if table + sum(lengths) != len(view):
        raise WireError("bad_batch", f"its length table (k={k}) does not add up to the frame's {len(view)} bytes")
    if table == head:  # (no message in parts: the common case, and every switch checks every batch)
        return lengths, [None] * k, table
    flat = struct.unpack_from(f">{sum(counts)}I", view, head)
    parts: list[list[int] | None] = []
    at = 0
    for n, c in zip(lengths, counts):
        p = list(flat[at : at + c]) if c else None
        at += c
        if p is not None and sum(p) != n:
            raise WireError("bad_batch", f"a message of {n} bytes lists parts summing to {sum(p)}")
        parts.append(p)
    return lengths, parts, table


def table_refusal(meta: dict[str, Any], payload: Any) -> tuple[str, str] | None:
    """("bad_batch", why) when a DATA frame with this meta and payload is a batch whose table does not describe its
    payload exactly (`unpack_table`); None for a sound batch or any other frame. Each switch checks every batch
    frame it relays with this, so a lie is refused and audited where it enters; receivers check again."""
    k = meta.get("batch")
    if k is None:
        return None
    try:
        unpack_table(payload, k)
    except WireError as exc:
        return exc.code, f"batch frame of {k} messages refused: {exc.message}; a sender's table lists exactly the " \
                         "lengths (and part lengths) of the messages that follow it (nebula.wire.batch)"
    return None
