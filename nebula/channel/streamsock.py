"""A worker's connection to its switch's Unix stream socket, shaped like the ZeroMQ DEALER socket it stands in for.

Over the stream socket a message goes from the worker's I/O thread into the kernel and out to the switch's event
loop, with no ZeroMQ I/O thread on either side: two thread hand-overs fewer per message each way. The I/O thread
uses the subset of the socket interface it uses on ZeroMQ (`send_multipart`, `recv_multipart`, `get(EVENTS)`,
`poll`, a descriptor for its poller), so everything above the socket is the same on both. Messages are framed by
`nebula.wire.stream`; the connection authenticates first with the worker's key and derived password, and a switch
that refuses them is reported as ZeroMQ reports a failed handshake. A lost connection is made again (as ZeroMQ
reconnects) on the next send or poll, at most every RECONNECT_S; what was queued for the old one is dropped, as
ZeroMQ drops it, and the channels send again what was not acknowledged.
"""
from __future__ import annotations

__all__ = ["StreamPart", "StreamSocket"]

import itertools
import os
import select
import socket
import time
from collections import deque
from typing import Any, Callable

import zmq

from nebula.wire.stream import AUTH, AUTH_NO, AUTH_OK, MessageParser, StreamError, pack_message

OUT_HIGH_BYTES = 4 * 1024 * 1024  # bytes queued here before `send_multipart` says Again (ZeroMQ's SNDHWM)
RECONNECT_S = 0.1


class StreamPart:
    """One part of a received message, as the I/O thread reads a ZeroMQ frame: `.buffer`, `.bytes`."""

    __slots__ = ("buffer",)

    def __init__(self, buffer: memoryview) -> None:
        self.buffer = buffer

    @property
    def bytes(self) -> bytes:
        return bytes(self.buffer)


class StreamSocket:
    """Non-blocking stream connection to `path` (a Unix socket; a leading "@" names an abstract one). `on_event`
    gets ZeroMQ monitor-style events: {"event": EVENT_CONNECTED | EVENT_CONNECT_RETRIED |
    EVENT_HANDSHAKE_FAILED_AUTH, "value": ...}."""

    def __init__(self, path: str, username: bytes, password: bytes, max_bytes: int,
                 on_event: Callable[[dict], None]) -> None:
        self.path = "\0" + path[1:] if path.startswith("@") else path
        self.creds = (username, password)
        self.max_bytes = max_bytes
        self.on_event = on_event
        self.linger = 0  # ms a close waits for queued bytes to leave
        self.sock: socket.socket | None = None
        self.parser = MessageParser(max_bytes)
        self.inbox: deque[list[StreamPart]] = deque()
        self.out: deque[memoryview] = deque()
        self.out_bytes = 0
        self.user_id = ""  # "name/account", once the switch accepted us
        self.refused = False
        self._tried = 0.0
        self._idle_r, self._idle_w = os.pipe()  # polled while unconnected: never readable

    # ---- connection ----
    def _connect(self) -> bool:
        if self.sock is not None:
            return True
        now = time.monotonic()
        if self.refused or now - self._tried < RECONNECT_S:
            return False
        self._tried = now
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(self.path)
        except OSError:
            s.close()
            self.on_event({"event": zmq.EVENT_CONNECT_RETRIED, "value": 0})
            return False
        s.setblocking(False)
        self.sock, self.parser, self.user_id = s, MessageParser(self.max_bytes), ""
        self.out.clear()
        self.out_bytes = 0
        self._queue([AUTH, *self.creds])
        self.on_event({"event": zmq.EVENT_CONNECTED, "value": 0})
        return True

    def _lost(self) -> None:
        if self.sock is not None:
            self.sock.close()
        self.sock = None
        self.inbox.clear()
        self.out.clear()
        self.out_bytes = 0

    def fileno(self) -> int:
        """What the I/O thread's poller watches: the connection, or (while there is none) a descriptor that is
        never ready, so that the poll's timeout paces the next attempt."""
        if self.sock is None:
            self._connect()
        return self.sock.fileno() if self.sock is not None else self._idle_r

    # ---- sending ----
    def _queue(self, parts: Any) -> None:
        for piece in pack_message(parts):
            view = memoryview(piece).cast("B") if not isinstance(piece, bytes) else memoryview(piece)
            self.out.append(view)
            self.out_bytes += len(view)

    def flush(self) -> None:
        """Write what is queued until the kernel takes no more."""
        sock, out = self.sock, self.out
        while out and sock is not None:
            batch = list(itertools.islice(out, 64))
            try:
                n = sock.sendmsg(batch)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self._lost()
                return
            self.out_bytes -= n
            while n:
                head = out[0]
                if n >= len(head):
                    n -= len(head)
                    out.popleft()
                else:
                    out[0] = head[n:]
                    n = 0

    def send_multipart(self, parts: Any, flags: int = 0, copy: bool = True) -> None:
        """Queue one message and write what the kernel takes; zmq.Again when too much is queued already or
        there is no connection (as a DEALER without a peer)."""
        if not self._connect():
            raise zmq.Again()
        if self.out_bytes > OUT_HIGH_BYTES:
            self.flush()
            if self.out_bytes > OUT_HIGH_BYTES:
                raise zmq.Again()
        self._queue(parts)
        self.flush()

    def send(self, data: Any, flags: int = 0) -> None:
        """One message of one part."""
        self.send_multipart([data], flags)

    # ---- receiving ----
    def _read(self) -> None:
        sock = self.sock
        while sock is not None:
            try:
                n = sock.recv_into(self.parser.buffer())
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                n = 0
            if n == 0:
                self._lost()
                return
            try:
                messages = self.parser.taken(n)
            except StreamError:
                self._lost()
                return
            for parts in messages:
                self._take(parts)

    def _take(self, parts: list[memoryview]) -> None:
        if not self.user_id:  # the switch's answer to AUTH comes first
            tag = bytes(parts[0])
            if tag == AUTH_OK and len(parts) == 2:
                self.user_id = bytes(parts[1]).decode(errors="replace")
                return
            self.refused = True
            reason = bytes(parts[1]).decode(errors="replace") if tag == AUTH_NO and len(parts) > 1 else "no answer"
            self._lost()
            self.on_event({"event": zmq.EVENT_HANDSHAKE_FAILED_AUTH, "value": reason})
            return
        self.inbox.append([StreamPart(p) for p in parts])

    def recv_multipart(self, flags: int = 0, copy: bool = True) -> list[Any]:
        """The next message, as bytes (as `StreamPart`s with copy=False); zmq.Again when none is complete (with
        NOBLOCK), else waits for one."""
        if not self.inbox:
            self._read()
            while not self.inbox and not flags & zmq.NOBLOCK and self.sock is not None:
                select.select([self.sock], [], [])
                self._read()
        if not self.inbox:
            raise zmq.Again()
        parts = self.inbox.popleft()
        return [p.bytes for p in parts] if copy else parts  # type: ignore[return-value]

    # ---- readiness ----
    def get(self, option: int) -> int:
        """ZeroMQ's EVENTS: POLLIN with a message read and waiting, POLLOUT with room to queue one (nothing is read
        here: the sending path asks before every message)."""
        if option != zmq.EVENTS:
            raise ValueError(f"only zmq.EVENTS is answered here, not {option}")
        ready = zmq.POLLIN if self.inbox else 0
        if self.sock is not None and self.out_bytes <= OUT_HIGH_BYTES:
            ready |= zmq.POLLOUT
        return ready

    def poll(self, timeout_ms: float, flags: int = zmq.POLLIN) -> int:
        """Wait up to `timeout_ms` for `flags` (POLLIN: a message; POLLOUT: queued bytes written)."""
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            self.flush()
            if not self.inbox:
                self._read()
            ready = self.get(zmq.EVENTS)
            if flags & zmq.POLLOUT and not self.out and self.sock is not None:
                return zmq.POLLOUT
            if ready & flags & zmq.POLLIN:
                return zmq.POLLIN
            left = deadline - time.monotonic()
            if left <= 0:
                return 0
            fd = self.fileno()
            select.select([fd], [fd] if self.out else [], [], min(left, RECONNECT_S))

    def close(self, linger: int | None = None) -> None:
        """Close after at most `linger` (else `self.linger`) ms spent writing what is queued."""
        wait_ms = self.linger if linger is None else linger
        if self.out and self.sock is not None and wait_ms:
            self.poll(wait_ms, zmq.POLLOUT)
        self._lost()
        for fd in (self._idle_r, self._idle_w):
            try:
                os.close(fd)
            except OSError:
                pass
