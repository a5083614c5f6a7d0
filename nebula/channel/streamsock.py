"""A worker's stream connection to its switch, shaped like the ZeroMQ DEALER socket it stands in for: the switch's
Unix stream socket on its host, or its TLS endpoint for workers (`local.tls_endpoint`) from other hosts.

Over the stream socket a message goes from the worker's I/O thread into the kernel and out to the switch's event
loop, with no ZeroMQ I/O thread on either side: two thread hand-overs fewer per message each way. The I/O thread
uses the subset of the socket interface it uses on ZeroMQ (`send_multipart`, `recv_multipart`, `get(EVENTS)`,
`poll`, a descriptor for its poller), so everything above the socket is the same on both. Messages are framed by
`nebula.wire.stream`; the connection authenticates first with the worker's key and derived password, and a switch
that refuses them is reported as ZeroMQ reports a failed handshake. A lost connection is made again (as ZeroMQ
reconnects) on the next send or poll, at most every RECONNECT_S; what was queued for the old one is dropped, as
ZeroMQ drops it, and the channels send again what was not acknowledged. Over TLS the connection is dialled without
blocking (`channel.tlsdial`), and what is sent is regrouped into whole TLS writes (`wire.stream.tls_writes`).
"""
from __future__ import annotations

__all__ = ["StreamPart", "StreamSocket", "TLSTarget"]

import itertools
import os
import select
import socket
import ssl
import time
from collections import deque
from typing import Any, Callable

import zmq

from nebula.channel.tlsdial import DialFailed, TLSDial, certificate_refused
from nebula.wire.share import PUT, SHARE_TAG, ShareCache, pack_ask, pack_op, read_grant
from nebula.wire.stream import AUTH, AUTH_NO, AUTH_OK, MessageParser, StreamError, frame_parts, tls_writes

OUT_HIGH_BYTES = 4 * 1024 * 1024  # bytes queued here before `send_multipart` says Again (ZeroMQ's SNDHWM)
RECONNECT_S = 0.1
_AGAIN = (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError)


class TLSTarget:
    """Where and how a stream connection over TLS dials: host, port, context, and the check of the switch's
    identity (what is wrong with it, "" when nothing)."""

    __slots__ = ("host", "port", "ctx", "verify")

    def __init__(self, host: str, port: int, ctx: ssl.SSLContext, verify: Callable[[ssl.SSLSocket], str]) -> None:
        self.host, self.port, self.ctx, self.verify = host, port, ctx, verify


class StreamPart:
    """One part of a received message, as the I/O thread reads a ZeroMQ frame: `.buffer`, `.bytes`."""

    __slots__ = ("buffer",)

    def __init__(self, buffer: memoryview) -> None:
        self.buffer = buffer

    @property
    def bytes(self) -> bytes:
        return bytes(self.buffer)


def _write_vectored(sock: socket.socket, out: deque[memoryview]) -> int | None:
    """Write `out`'s pieces (64 per call) until the kernel takes no more; bytes written, None if the connection
    is lost."""
    written = 0
    while out:
        try:
            n = sock.sendmsg(list(itertools.islice(out, 64)))
        except (BlockingIOError, InterruptedError):
            break
        except OSError:
            return None
        written += n
        while n:
            head = out[0]
            if n >= len(head):
                n -= len(head)
                out.popleft()
            else:
                out[0] = head[n:]
                n = 0
    return written


def _write_tls(sock: ssl.SSLSocket, out: deque[memoryview]) -> int | None:
    """Write `out`'s writes (`tls_writes`) whole until the kernel takes no more; as `_write_vectored`."""
    written = 0
    while out:
        try:
            # all or nothing: OpenSSL keeps what it took of a refused write and wants the same bytes again
            sock.send(out[0])
        except _AGAIN:
            break
        except OSError:
            return None
        written += len(out.popleft())
    return written


class StreamSocket:
    """Non-blocking stream connection to `path` (a Unix socket; a leading "@" names an abstract one), or to `tls`.
    `on_event` gets ZeroMQ monitor-style events: {"event": EVENT_CONNECTED | EVENT_CONNECT_RETRIED |
    EVENT_HANDSHAKE_FAILED_AUTH | EVENT_HANDSHAKE_FAILED_PROTOCOL (TLS), "value": ...}."""

    def __init__(self, path: str, username: bytes, password: bytes, max_bytes: int,
                 on_event: Callable[[dict], None], tls: TLSTarget | None = None) -> None:
        self.path = "\0" + path[1:] if path.startswith("@") else path
        self.tls = tls
        self.dial: TLSDial | None = None
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
        self.share_ask = 0  # slots to ask the switch for (`nebula.wire.share`); a combiner's model goes once
        self.share: ShareCache | None = None  # this connection's slots, once AUTH_OK granted some
        self.refused = False
        self._tried = 0.0
        self._idle_r, self._idle_w = os.pipe()  # polled while unconnected: never readable

    # ---- connection ----
    def _connect(self) -> bool:
        if self.sock is not None:
            return True
        if self.dial is not None:
            return self._dialing()
        now = time.monotonic()
        if self.refused or now - self._tried < RECONNECT_S:
            return False
        self._tried = now
        if self.tls is not None:
            try:
                self.dial = TLSDial(self.tls.host, self.tls.port, self.tls.ctx, self.tls.verify)
            except DialFailed as exc:
                return self._failed(exc)
            return self._dialing()
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(self.path)
        except OSError:
            s.close()
            self.on_event({"event": zmq.EVENT_CONNECT_RETRIED, "value": 0})
            return False
        s.setblocking(False)
        self._opened(s)
        return True

    def _dialing(self) -> bool:
        try:
            s = self.dial.step()
        except DialFailed as exc:
            return self._failed(exc)
        if s is None:
            return False
        self.dial = None
        self._opened(s)
        return True

    def _failed(self, exc: DialFailed) -> bool:
        self.dial = None
        if exc.fatal:
            self._refused(zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, str(exc))
        else:
            self.on_event({"event": zmq.EVENT_CONNECT_RETRIED, "value": str(exc)})
        return False

    def _refused(self, event: int, reason: str) -> None:
        self.refused = True
        self._lost()
        self.on_event({"event": event, "value": reason})

    def _opened(self, s: socket.socket) -> None:
        self.sock, self.parser, self.user_id, self.share = s, MessageParser(self.max_bytes), "", None
        self.out.clear()
        self.out_bytes = 0
        self._queue([AUTH, *self.creds, *([pack_ask(self.share_ask)] if self.share_ask else [])])
        self.on_event({"event": zmq.EVENT_CONNECTED, "value": 0})

    @property
    def wants_write(self) -> bool:
        """Whether the poller should wake this socket when it turns writable."""
        return bool(self.out) or self.dial is not None and self.dial.wants_write

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
        if self.sock is not None:
            return self.sock.fileno()
        return self.dial.fileno() if self.dial is not None else self._idle_r

    # ---- sending ----
    def _queue(self, parts: Any) -> None:
        pieces = frame_parts(parts)
        for piece in (tls_writes(pieces) if self.tls is not None else pieces):
            view = memoryview(piece).cast("B") if not isinstance(piece, bytes) else memoryview(piece)
            self.out.append(view)
            self.out_bytes += len(view)

    def flush(self) -> None:
        """Write what is queued until the kernel takes no more."""
        if self.sock is not None:
            written = (_write_tls if self.tls is not None else _write_vectored)(self.sock, self.out)
            if written is None:
                self._lost()
            else:
                self.out_bytes -= written

    def _room(self) -> None:
        """zmq.Again unless a message may be queued now: connected, and not too much queued already."""
        if not self._connect():
            raise zmq.Again()
        if self.out_bytes > OUT_HIGH_BYTES:
            self.flush()
            if self.out_bytes > OUT_HIGH_BYTES:
                raise zmq.Again()

    def send_multipart(self, parts: Any, flags: int = 0, copy: bool = True) -> None:
        """Queue one message and write what the kernel takes; zmq.Again when too much is queued already or
        there is no connection (as a DEALER without a peer)."""
        self._room()
        self._queue(parts)
        self.flush()

    def send_shared(self, head: Any, payload: Any, key: Any) -> None:
        """Queue a frame whose payload `key` names: put into a slot of the switch's, or named by its slot if it is
        there already (`nebula.wire.share`)."""
        self._room()
        if self.share is None:  # (a new connection, not granted slots yet)
            self._queue([head, payload])
        else:  # (looked up only once the frame is sure to be queued: both ends stay in step)
            op, slot = self.share.lookup(key)
            self._queue([head, SHARE_TAG, pack_op(op, slot), *([payload] if op == PUT else [])])
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
            except _AGAIN:
                return
            except ssl.SSLError as exc:
                if not self.user_id and certificate_refused(exc):
                    # (TLS 1.3: a switch refuses our certificate after our side of the handshake is done)
                    self._refused(zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, f"TLS: {exc.reason or exc}")
                    return
                n = 0
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
            if tag == AUTH_OK and len(parts) in (2, 3):
                self.user_id = bytes(parts[1]).decode(errors="replace")
                granted = read_grant(parts[2]) if len(parts) == 3 else None
                self.share = ShareCache(*granted) if granted else None
                return
            reason = bytes(parts[1]).decode(errors="replace") if tag == AUTH_NO and len(parts) > 1 else "no answer"
            self._refused(zmq.EVENT_HANDSHAKE_FAILED_AUTH, reason)
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
            select.select([fd], [fd] if self.wants_write else [], [], min(left, RECONNECT_S))

    def close(self, linger: int | None = None) -> None:
        """Close after at most `linger` (else `self.linger`) ms spent writing what is queued."""
        wait_ms = self.linger if linger is None else linger
        if self.out and self.sock is not None and wait_ms:
            self.poll(wait_ms, zmq.POLLOUT)
        self._lost()
        if self.dial is not None:
            self.dial.close()
            self.dial = None
        for fd in (self._idle_r, self._idle_w):
            try:
                os.close(fd)
            except OSError:
                pass
