"""Messages of parts on a byte stream: how a worker and its switch talk over the switch's Unix stream socket.

A message is a 5-byte head (">IB": the parts' total bytes, the part count), the parts' lengths (">I" each), then
the parts. It carries what a ZeroMQ multipart message carries on the IPC endpoint (a frame's head and payload, or
its head, `SHM_TAG` and a shared-memory descriptor), so both ends handle the same parts whichever socket brought
them. The first message of a connection is the worker's AUTH (its CURVE public key and the password derived from
it, as ZeroMQ PLAIN would carry them, and optionally the slots it asks for, `nebula.wire.share`); the switch
answers AUTH_OK with the worker's "name/account" (and the slots it grants), or AUTH_NO with the reason, and closes.
"""
from __future__ import annotations

__all__ = ["AUTH", "AUTH_NO", "AUTH_OK", "CERT_REFUSED", "JOIN_BELOW_BYTES", "MAX_PARTS", "MessageParser", "StreamError", "frame_parts",
           "tls_writes"]

import struct
from typing import Any, Sequence

AUTH = b"NEBULA-AUTH"
AUTH_OK = b"NEBULA-AUTH-OK"
AUTH_NO = b"NEBULA-AUTH-NO"
CERT_REFUSED = "certificate refused"  # how an AUTH_NO over TLS that refuses the certificate (not the key) begins
# a frame's head and payload; head, SHM_TAG and a descriptor; or head, SHARE_TAG, a descriptor and (for a PUT) the
# payload (`nebula.wire.share`)
MAX_PARTS = 4
_HEAD = struct.Struct(">IB")
DIRECT_BYTES = 64 * 1024  # messages at least this large are read straight into their own buffer
# over TLS, writes smaller than this are joined with their neighbours: one record and one syscall instead of several
JOIN_BELOW_BYTES = 16 * 1024


class StreamError(ValueError):
    """The stream is not made of such messages, or a message is over the receiver's limit: the connection ends."""


def frame_parts(parts: Sequence[Any]) -> list[Any]:
    """The pieces to write, in order, for one message of `parts` (bytes-like): its head, then the parts."""
    n = len(parts)
    if not 0 < n <= MAX_PARTS:
        raise StreamError(f"a message has 1 to {MAX_PARTS} parts, not {n}")
    lengths = [memoryview(p).nbytes for p in parts]
    return [_HEAD.pack(sum(lengths), n) + struct.pack(f">{n}I", *lengths), *parts]


class MessageParser:
    """Messages out of the bytes of one stream, each a list of parts (memoryviews of a buffer of its own);
    `max_bytes`: the most one message may carry (beyond, StreamError before its bytes are read). A message of at
    least DIRECT_BYTES gets its buffer as soon as its head is in, and the rest of it is read straight into that
    buffer: large payloads are not copied out of the staging buffer."""

    def __init__(self, max_bytes: int, staging_bytes: int = 256 * 1024) -> None:
        self.max_bytes = max_bytes
        self._buf = bytearray(staging_bytes)
        self._view = memoryview(self._buf)
        self._lo = self._hi = 0
        self._body: memoryview | None = None  # the large message being read, straight into its own buffer
        self._lengths: tuple[int, ...] = ()
        self._got = 0

    def buffer(self) -> memoryview:
        """Where the next bytes of the stream go (`taken(n)` once `n` of them are there)."""
        if self._body is not None:
            return self._body[self._got :]
        if self._lo and len(self._buf) - self._hi < 64 * 1024:
            n = self._hi - self._lo
            self._buf[:n] = self._view[self._lo : self._hi]
            self._lo, self._hi = 0, n
        return self._view[self._hi :]

    def taken(self, nbytes: int) -> list[list[memoryview]]:
        """`nbytes` more arrived: the messages now complete, in order."""
        out = []
        if self._body is not None:
            self._got += nbytes
            if self._got < len(self._body):
                return out
            out.append(_split(self._body, self._lengths))
            self._body = None
            return out
        self._hi += nbytes
        view = self._view
        while self._hi - self._lo >= _HEAD.size:
            total, n = _HEAD.unpack_from(view, self._lo)
            if not 0 < n <= MAX_PARTS or total > self.max_bytes:
                raise StreamError(f"a message of {n} parts and {total} bytes: at most {MAX_PARTS} parts and "
                                  f"{self.max_bytes} bytes are accepted")
            head = _HEAD.size + 4 * n
            need = head + total
            if self._hi - self._lo < head:
                break
            lengths = struct.unpack_from(f">{n}I", view, self._lo + _HEAD.size)
            if sum(lengths) != total:
                raise StreamError(f"a message's part lengths {list(lengths)} do not add up to its {total} bytes")
            at = self._lo + head
            if self._hi - self._lo < need:
                if total >= DIRECT_BYTES:  # (the rest of it goes straight into its own buffer)
                    have = self._hi - at
                    self._body = memoryview(bytearray(total))
                    self._body[:have] = view[at : self._hi]
                    self._lengths, self._got = lengths, have
                    self._lo = self._hi = 0
                elif need > len(self._buf) - self._lo:
                    self._grow(need)
                break
            out.append(_split(memoryview(bytes(view[at : at + total])), lengths))  # (the staging buffer is reused)
            self._lo += need
        if self._lo == self._hi:
            self._lo = self._hi = 0
        return out

    def widen(self, max_bytes: int, staging_bytes: int = 256 * 1024) -> None:
        """Accept messages up to `max_bytes` from now on, through a staging buffer of at least `staging_bytes`
        (a connection starts narrow until it has authenticated)."""
        self.max_bytes = max_bytes
        if staging_bytes > len(self._buf):
            self._grow(staging_bytes)

    def _grow(self, need: int) -> None:
        n = self._hi - self._lo
        buf = bytearray(max(need, len(self._buf)))
        buf[:n] = self._view[self._lo : self._hi]
        self._buf, self._view, self._lo, self._hi = buf, memoryview(buf), 0, n


def _split(body: memoryview, lengths: tuple[int, ...]) -> list[memoryview]:
    parts, off = [], 0
    for k in lengths:
        parts.append(body[off : off + k])
        off += k
    return parts


def tls_writes(parts: Sequence[Any], join_below: int = JOIN_BELOW_BYTES) -> list[Any]:
    """`parts` regrouped into the buffers to hand to a TLS socket's write, one write each: small parts are joined
    (one record, one syscall), and small parts before a large one ride in its first record, which copies less than
    a record where joining the whole large part would copy all of it."""
    if sum(len(p) for p in parts) < join_below:
        return [b"".join(parts)]
    out: list[Any] = []
    small: list[Any] = []
    small_bytes = 0
    for p in parts:
        if len(p) < join_below:
            small.append(p)
            small_bytes += len(p)
        elif small:
            view = memoryview(p).cast("B")
            cut = max(0, join_below - small_bytes)
            out += [b"".join([*small, view[:cut]]), view[cut:]]
            small, small_bytes = [], 0
        else:
            out.append(p)
    if small:
        out.append(b"".join(small))
    return out
