"""Peer-link stream: a buffered protocol that parses frames as TLS decrypts them, without StreamReader's copies.

Small frames are parsed out of one reusable staging buffer; a large frame gets its own buffer and TLS decrypts
the rest of it straight into that buffer, so its payload reaches the next hop as a view that was never copied. A
`placer` may name a better place for a large frame's payload once its head is in: a local worker's shared-memory
arena, where the worker then reads it.
"""
from __future__ import annotations

__all__ = ["FrameStream", "write_frame"]

import asyncio
from collections import deque
from dataclasses import replace
from typing import Any, Callable

from nebula.wire import HEADER_BYTES, Frame, WireError, decode_frame, head_frame, unpack_header

STAGING_BYTES = 256 * 1024
# a frame at least this large is read into a buffer of its own (smaller ones are copied out of the staging buffer)
OWN_BUFFER_BYTES = 32 * 1024
MAX_QUEUED_FRAMES = 256  # parsed but not yet consumed: reading pauses beyond this


def _expire(w: asyncio.Future) -> None:
    if not w.done():
        w.set_exception(asyncio.TimeoutError("no frame from the peer in time"))


class FrameParser:
    """Frames out of the bytes of one stream: a staging buffer for small frames, a buffer of its own (or the
    `placer`'s region) for each large one. `_deliver(frame, head, payload)` takes each frame as it is parsed."""

    def __init__(self, max_payload: int, staging_bytes: int = STAGING_BYTES) -> None:
        self.max_payload = max_payload
        self._buf = bytearray(staging_bytes)
        self._view = memoryview(self._buf)
        self._lo = 0  # unparsed bytes are _buf[_lo:_hi]
        self._hi = 0
        self._body: bytearray | None = None  # a large frame being filled: whole frame bytes
        self._body_view: memoryview | None = None
        self._body_got = 0
        self._meta_end = 0
        self._error: BaseException | None = None  # what ended the stream: nothing after it is delivered
        # (frame without payload, payload bytes) -> where to read that payload, or None: its own buffer
        self.placer: Callable[[Frame, int], memoryview | None] | None = None
        self._known: tuple[bytes, Frame] | None = None  # head and frame of the large frame being filled, if parsed
        self._placed = False  # that frame's payload goes where the placer said (`_body_view`)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._body_view is not None:
            return self._body_view[self._body_got :]
        if len(self._buf) - self._hi < OWN_BUFFER_BYTES:
            self._compact()
        return self._view[self._hi :]

    def _take(self, nbytes: int) -> None:
        """`nbytes` more arrived where `get_buffer` said: parse what is complete (WireError if malformed)."""
        if self._body_view is not None:
            self._body_got += nbytes
            if self._body_got == len(self._body_view):
                self._finish_body()
        else:
            self._hi += nbytes
            self._parse()

    def grow(self, staging_bytes: int = STAGING_BYTES) -> None:
        """Enlarge the staging buffer (a connection starts small until its peer has identified itself)."""
        if staging_bytes > len(self._buf):
            n = self._hi - self._lo
            buf = bytearray(staging_bytes)
            buf[:n] = self._view[self._lo : self._hi]
            self._buf, self._view, self._lo, self._hi = buf, memoryview(buf), 0, n

    def _compact(self) -> None:
        n = self._hi - self._lo
        if self._lo:
            self._buf[:n] = self._view[self._lo : self._hi]
        self._lo, self._hi = 0, n

    def _parse(self) -> None:
        view = self._view
        while self._hi - self._lo >= HEADER_BYTES:
            lo = self._lo
            h = unpack_header(view[lo : lo + HEADER_BYTES], max_payload_bytes=self.max_payload)
            meta_end = HEADER_BYTES + h.meta_len
            need = meta_end + h.payload_len
            have = self._hi - lo
            # a large frame's head is parsed once, as soon as it is in: the placer sees it, and the frame is
            # delivered with it whether placed or not
            known = self._head_of(lo, meta_end) if need >= OWN_BUFFER_BYTES and have >= meta_end else None
            placed = (known is not None and self.placer is not None
                      and self._place(known, lo, meta_end, min(have, need)))
            if have >= need:
                self._lo = lo + need
                if placed:
                    self._finish_body()
                else:
                    self._emit(bytes(view[lo : lo + need]), meta_end, known)
                continue
            if placed:
                self._lo = self._hi = 0
                return
            if need >= OWN_BUFFER_BYTES:
                body = bytearray(need)
                body[:have] = view[lo : self._hi]
                self._body, self._body_view, self._body_got, self._meta_end = body, memoryview(body), have, meta_end
                self._known = known
                self._lo = self._hi = 0
                return
            if lo + need > len(self._buf):
                self._compact()
            return
        if self._lo == self._hi:
            self._lo = self._hi = 0

    def _head_of(self, lo: int, meta_end: int) -> tuple[bytes, Frame] | None:
        """The head at `lo` and its frame, payload still to come (None if malformed: raised in its turn, once the
        whole frame is in, by `_emit`)."""
        head = bytes(self._view[lo : lo + meta_end])
        try:
            return head, head_frame(head, max_payload_bytes=self.max_payload)
        except WireError:
            return None

    def _place(self, known: tuple[bytes, Frame], lo: int, meta_end: int, have: int) -> bool:
        """Ask the placer for the payload's place; True if it gave one (the bytes already in are moved there)."""
        frame = known[1]
        n = frame.header.payload_len
        dest = self.placer(frame, n)  # type: ignore[misc]
        if dest is None or len(dest) != n:
            return False
        got = have - meta_end
        dest[:got] = self._view[lo + meta_end : lo + have]
        self._known, self._placed, self._body_view, self._body_got = known, True, dest, got
        return True

    def _finish_body(self) -> None:
        body, body_view, meta_end = self._body, self._body_view, self._meta_end
        known, placed = self._known, self._placed
        self._body = self._body_view = self._known = None
        self._placed = False
        self._body_got = 0
        if placed:
            assert known is not None and body_view is not None
            if self._error is None:
                head, frame = known
                self._deliver(replace(frame, payload=body_view), head, body_view)
            return
        assert body is not None
        self._emit(body, meta_end, known)

    def _emit(self, raw: bytes | bytearray, meta_end: int, known: tuple[bytes, Frame] | None = None) -> None:
        if self._error is not None:  # the stream has ended: what follows in the buffer is not looked at
            return
        payload: Any = memoryview(raw)[meta_end:] if len(raw) > meta_end else b""
        if known is not None:  # (its head parsed already)
            head, frame = known
            self._deliver(replace(frame, payload=payload), head, payload)
            return
        head = bytes(raw[:meta_end]) if isinstance(raw, bytearray) else raw[:meta_end]
        self._deliver(decode_frame(head, payload, max_payload_bytes=self.max_payload), head, payload)

    def _deliver(self, frame: Frame, head: bytes, payload: Any) -> None:
        raise NotImplementedError


class FrameStream(FrameParser, asyncio.BufferedProtocol):
    """Protocol of one peer-link connection: `await read_frame()` for parsed frames, `write`/`drain` to send."""

    def __init__(self, max_payload: int, staging_bytes: int = STAGING_BYTES) -> None:
        super().__init__(max_payload, staging_bytes)
        self.transport: Any = None
        self._frames: deque[tuple[Any, bytes, Any]] = deque()
        self._waiter: asyncio.Future | None = None
        self._read_paused = False
        self._write_paused = False
        self._drain_waiter: asyncio.Future | None = None
        self._lost = False
        self._handler: Any = None  # set by dispatch(): frames go to it as they are parsed
        self._seen = 0  # frames handed to the handler

    # ---- protocol callbacks ----
    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def buffer_updated(self, nbytes: int) -> None:
        try:
            self._take(nbytes)
        except WireError as exc:
            self._fail(exc)
            self.transport.pause_reading()
            return
        self._wake()
        if len(self._frames) >= MAX_QUEUED_FRAMES and not self._read_paused:
            self._read_paused = True
            self.transport.pause_reading()

    def eof_received(self) -> bool:
        self._fail(asyncio.IncompleteReadError(b"", None))
        return False

    def connection_lost(self, exc: BaseException | None) -> None:
        self._lost = True
        self._fail(ConnectionResetError(f"connection lost: {exc}") if exc else asyncio.IncompleteReadError(b"", None))
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_exception(ConnectionResetError("connection lost"))

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_result(None)

    def _deliver(self, frame: Frame, head: bytes, payload: Any) -> None:
        if self._handler is not None:
            self._dispatch((frame, head, payload))
        else:
            self._frames.append((frame, head, payload))

    def _dispatch(self, item: tuple[Any, bytes, Any]) -> None:
        self._seen += 1
        try:
            self._handler(*item)
        except Exception as exc:  # ends the stream; serve() raises it
            self._fail(exc)
            if self.transport is not None:
                self.transport.pause_reading()

    @property
    def error(self) -> BaseException | None:
        """What ended the stream (a peer's TLS alert, a reset), or None while it lives."""
        return self._error

    def _fail(self, exc: BaseException) -> None:
        if self._error is None:
            self._error = exc
        self._wake()

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done() and (self._frames or self._error is not None):
            w.set_result(None)

    # ---- consumer side ----
    def dispatch(self, handler: Any) -> None:
        """From now on call `handler(frame, head, payload)` for each frame inside the protocol callback, as it is
        parsed (no task wake-up per frame); frames already queued go first. An exception from the handler ends
        the stream, and `serve` raises it."""
        self._handler = handler
        while self._frames and self._error is None:
            self._dispatch(self._frames.popleft())
        if self._read_paused and self._error is None:
            self._read_paused = False
            self.transport.resume_reading()

    async def serve(self, idle_timeout: float) -> None:
        """While `dispatch` hands frames on: return never; raise what ended the stream (a handler's exception,
        WireError, connection loss), or TimeoutError when no frame came for `idle_timeout` seconds."""
        loop = asyncio.get_running_loop()
        while True:
            if self._error is not None:
                raise self._error
            seen = self._seen
            w = self._waiter = loop.create_future()
            timer = loop.call_later(idle_timeout, _expire, w)
            try:
                await w
            except asyncio.TimeoutError:
                if self._seen == seen and self._error is None:
                    raise
            finally:
                self._waiter = None
                timer.cancel()

    async def read_frame(self, timeout: float | None = None) -> tuple[Any, bytes, Any]:
        """Next frame as (frame, head bytes, payload); raises WireError, IncompleteReadError, ConnectionError,
        or TimeoutError when no frame arrived within `timeout` seconds."""
        while not self._frames:
            if self._error is not None:
                raise self._error
            loop = asyncio.get_running_loop()
            w = self._waiter = loop.create_future()
            # a timer instead of wait_for: no task per frame on the hot path
            timer = loop.call_later(timeout, _expire, w) if timeout is not None else None
            try:
                await w
            finally:
                self._waiter = None
                if timer is not None:
                    timer.cancel()
        item = self._frames.popleft()
        if self._read_paused and len(self._frames) < MAX_QUEUED_FRAMES // 2 and self._error is None:
            self._read_paused = False
            self.transport.resume_reading()
        return item

    def write(self, data: Any) -> None:
        """Write bytes to the transport."""
        self.transport.write(data)

    def writelines(self, parts: Any) -> None:
        """Write several buffers (views are not joined first where the transport can avoid it)."""
        self.transport.writelines(parts)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        """Transport information (e.g. `ssl_object`, `peername`)."""
        return self.transport.get_extra_info(name, default)

    async def drain(self) -> None:
        """Wait until the transport's write buffer is below its high-water mark."""
        if self._lost:
            raise ConnectionResetError("connection lost")
        if self.transport.is_closing():
            await asyncio.sleep(0)
            return
        if self._write_paused:
            self._drain_waiter = asyncio.get_running_loop().create_future()
            try:
                await self._drain_waiter
            finally:
                self._drain_waiter = None


def write_frame(writer: FrameStream, head: bytes, payload: Any = b"") -> None:
    """Write one frame (head, then payload without copying it first)."""
    if payload:
        writer.writelines((head, payload))
    else:
        writer.write(head)
