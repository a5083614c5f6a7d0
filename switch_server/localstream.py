"""The local side's Unix stream endpoint: same-host workers without ZeroMQ (`nebula.wire.stream`).

Beside the ROUTER's IPC endpoint the switch listens on a Unix stream socket (`nebula.config.stream_path` of
`local.ipc_endpoint`). A worker there authenticates with the same key and derived password as on IPC (the same
check, `ZapHandler.check_plain`, audited the same way); each connection then gets an identity, and its messages
reach the local side exactly as the ROUTER's do (identity first, then the frame's parts, each answering
`get("User-Id")`), so routing, refusals and delivery are one code. `StreamWorkers.send_multipart` takes what the
ROUTER takes (`Delivery` sends through `LocalSockets`, which picks by identity), and says Again when a worker's
connection holds more than HIGH_WATER unwritten, as a ROUTER at its high-water mark does.
"""
from __future__ import annotations

__all__ = ["LocalSockets", "StreamWorkers", "open_streams"]

import asyncio
import itertools
import logging
import os
import socket
import struct
from collections import deque
from typing import Any, Callable

import zmq

from nebula.config import stream_path
from nebula.wire import WireError
from nebula.wire.share import ShareSlots, pack_grant, read_ask
from nebula.wire.stream import AUTH, AUTH_NO, AUTH_OK, MessageParser, StreamError, frame_parts

log = logging.getLogger(__name__)

PREFIX = b"\x01"  # stream identities start so; ZeroMQ's own start with a zero byte
HIGH_WATER = 4 * 1024 * 1024
# messages handled per loop turn, from one connection here as from the ROUTER in `LocalSide._pump`: small, so a
# frame for a higher lane waits behind few bulk frames before the link writer runs
PUMP_BATCH = 16
AUTH_BYTES = 4096  # the most a connection may send before it has authenticated
AUTH_WITHIN_S = 10.0  # a connection that has not authenticated by then is ended
# messages to a worker up to this size (a frame's head and its shared-memory descriptor, an acknowledgement) wait
# for the end of the event loop's turn and go in one write: a receiving switch wrote each frame's descriptor with
# a system call of its own, 14% of its time at 64 KiB messages, and woke its worker as often
COALESCE_BYTES = 4096
MAX_UNPROVEN = 256  # connections not yet authenticated at once (beyond, ended as they come: descriptors are finite)


class _Part:
    """A message part as the local side reads a ZeroMQ frame: `.buffer`, `.bytes`, `.get("User-Id")`."""

    __slots__ = ("buffer", "user")

    def __init__(self, buffer: Any, user: str) -> None:
        self.buffer, self.user = buffer, user

    @property
    def bytes(self) -> bytes:
        return bytes(self.buffer)

    def get(self, prop: str) -> str:
        if prop != "User-Id":
            raise KeyError(prop)
        return self.user


def _peer(sock: Any) -> str:
    """The connecting process as the kernel vouches for it (SO_PEERCRED): "pid P uid U"."""
    try:
        pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                             struct.calcsize("3i")))
    except (OSError, AttributeError):
        return "unknown"
    return f"pid {pid} uid {uid}"


class _Conn(asyncio.BufferedProtocol):
    """One worker's connection ("unix" or "tls"): AUTH first, then messages handed to the local side while it
    reads."""

    def __init__(self, owner: "StreamWorkers", ident: bytes, kind: str = "unix") -> None:
        self.owner, self.ident, self.kind = owner, ident, kind
        self.cert: tuple[str, int, float] | None = None  # (over TLS) its certificate's worker, serial, expiry
        self.parser = MessageParser(AUTH_BYTES, staging_bytes=AUTH_BYTES)
        self.transport: asyncio.Transport | None = None
        self.user = ""
        self.waiting: deque[list[Any]] = deque()  # parsed while the local side holds workers back
        self.paused = False
        self.peer = ""
        self.slots: ShareSlots | None = None  # the payloads it shares (`nebula.wire.share`), once granted
        self.pending = bytearray()  # small messages to it, written together at the end of this turn of the loop

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        transport.set_write_buffer_limits(high=HIGH_WATER)
        if self.kind == "tls":  # (counted among the unproven since its TLS handshake began)
            name = transport.get_extra_info("peername")
            self.peer = f"{name[0]}:{name[1]}" if name else "unknown"
            cert = self.owner.check_cert(transport.get_extra_info("ssl_object"), self.peer)
            if isinstance(cert, str):  # (refused: the worker is told why, as a refused key is)
                transport.writelines(frame_parts([AUTH_NO, cert.encode()[:AUTH_BYTES]]))
                transport.close()
                return
            self.cert = cert
        else:
            self.peer = _peer(transport.get_extra_info("socket"))
            if len(self.owner.unproven) >= MAX_UNPROVEN:  # (a flood of idle connections holds nothing here)
                transport.abort()
                return
        self.owner.unproven.add(self)
        asyncio.get_running_loop().call_later(AUTH_WITHIN_S, self._expire)

    def _expire(self) -> None:
        if not self.user and self.transport is not None and not self.transport.is_closing():
            self.transport.abort()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.parser.buffer()

    def buffer_updated(self, nbytes: int) -> None:
        try:
            messages = self.parser.taken(nbytes)
        except StreamError:
            self.owner.ended_mid_message(self.kind, self.peer)
            self.transport.abort()
            return
        for parts in messages:
            if not self.user:
                if not self._auth(parts):
                    return
                continue
            if self.slots is not None:
                try:
                    parts = self.slots.resolve(parts)
                except WireError as exc:
                    self.owner.broke_share(self.kind, self.peer, self.user, exc.message)
                    self.transport.abort()
                    return
            user = self.user
            self.waiting.append([_Part(self.ident, user), *(_Part(p, user) for p in parts)])
        self.pump()

    def _auth(self, parts: list[memoryview]) -> bool:
        auth = len(parts) in (3, 4) and bytes(parts[0]) == AUTH  # (anything else is checked as no key: audited)
        user = self.owner.check(bytes(parts[1]) if auth else b"", bytes(parts[2]) if auth else b"",
                                f"{self.kind}:{self.peer}", self.kind,
                                self.cert[0] if self.cert is not None else None)
        if user is None:
            self.transport.writelines(frame_parts([AUTH_NO, b"unknown key or wrong password for it"]))
            self.transport.close()
            return False
        self.user = user
        self.owner.unproven.discard(self)
        self.parser.widen(self.owner.max_bytes())  # (what may come before is an AUTH's few bytes)
        self.slots = self.owner.grant(read_ask(parts[3])) if len(parts) == 4 else None
        grant = [] if self.slots is None else [pack_grant(len(self.slots.held), self.slots.slot_bytes)]
        self.transport.writelines(frame_parts([AUTH_OK, user.encode(), *grant]))
        return True

    def pump(self) -> None:
        """Hand waiting messages to the local side until it holds workers back (then stop reading)."""
        owner = self.owner
        handled = 0
        while self.waiting:
            if owner.holding() or handled == PUMP_BATCH:
                if not self.paused:
                    self.paused = True
                    owner.paused.add(self)
                    self.transport.pause_reading()
                if handled == PUMP_BATCH:
                    asyncio.get_running_loop().call_soon(self.pump)
                return
            owner.on_message(self.waiting.popleft())
            handled += 1
        if self.paused:
            self.paused = False
            owner.paused.discard(self)
            if not self.transport.is_closing():
                self.transport.resume_reading()

    def resume_writing(self) -> None:
        self.owner.writable(self.ident)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.slots is not None:
            self.owner.shared -= len(self.slots.held) * self.slots.slot_bytes
            self.slots = None
        self.owner.conns.pop(self.ident, None)
        self.owner.paused.discard(self)
        self.owner.unproven.discard(self)
        self.waiting.clear()


class StreamWorkers:
    """The stream listener and its connections, by identity."""

    def __init__(self, check: Callable[[bytes, bytes, str, str, str | None], str | None],
                 on_message: Callable[[list], None], holding: Callable[[], bool], writable: Callable[[bytes], None],
                 max_bytes: Callable[[], int], ended_mid_message: Callable[[str, str], None],
                 check_cert: Callable[[Any, str], tuple[str, int, float] | str] = lambda ssl_obj, peer: "no TLS",
                 share_budget: Callable[[], tuple[int, int]] = lambda: (0, 0),
                 broke_share: Callable[[str, str, str, str], None] = lambda kind, peer, user, why: None,
                 slot_tally: dict[str, int] | None = None) -> None:
        self.check, self.on_message, self.holding, self.writable = check, on_message, holding, writable
        self.max_bytes, self.ended_mid_message, self.check_cert = max_bytes, ended_mid_message, check_cert
        self.share_budget, self.broke_share = share_budget, broke_share  # ((all slots' bytes, one slot's), ...)
        self.shared = 0  # bytes of the slots granted to the connections now open
        self.slot_tally = {"put": 0, "used": 0} if slot_tally is None else slot_tally
        self.conns: dict[bytes, _Conn] = {}
        self.paused: set[_Conn] = set()  # connections not read while the local side holds workers back
        self.unproven: set[_Conn] = set()  # connections that have not authenticated yet
        self._ids = itertools.count(1)
        self.server: asyncio.AbstractServer | None = None
        self.tls_listener: Any = None  # (`switch_server.localtls`)
        self.handshakes: set[asyncio.Task] = set()  # TLS handshakes under way

    def grant(self, asked: int) -> ShareSlots | None:
        """Slots for a connection that asks for `asked` (`nebula.wire.share`): as many as the switch's budget for
        them has room for, counted until the connection ends; None for none."""
        budget, slot_bytes = self.share_budget()
        slots = min(asked, (budget - self.shared) // slot_bytes) if slot_bytes else 0
        if slots <= 0:
            return None
        self.shared += slots * slot_bytes
        return ShareSlots(slots, slot_bytes, self.slot_tally)

    async def start(self, path: str) -> None:
        """Listen on `path` (a leading "@": an abstract socket, as ZeroMQ's ipc://@name)."""
        address = "\0" + path[1:] if path.startswith("@") else path
        if not path.startswith("@") and os.path.exists(path):
            os.unlink(path)  # (left by a switch that was killed: a live one answers on the IPC endpoint first)
        self.server = await asyncio.get_running_loop().create_unix_server(self._accept, address)

    def _accept(self, kind: str = "unix") -> _Conn:
        ident = PREFIX + next(self._ids).to_bytes(8, "big")
        conn = self.conns[ident] = _Conn(self, ident, kind)
        return conn

    def accept_tls(self) -> _Conn | None:
        """A connection for a TLS handshake that begins (counted among the unproven), or None beyond
        MAX_UNPROVEN."""
        if len(self.unproven) >= MAX_UNPROVEN:
            return None
        conn = self._accept("tls")
        self.unproven.add(conn)
        return conn

    def forget(self, conn: _Conn) -> None:
        """Drop a connection whose TLS handshake failed."""
        self.conns.pop(conn.ident, None)
        self.unproven.discard(conn)

    def resume(self) -> None:
        """The local side reads workers again: hand on what waited."""
        for conn in list(self.paused):
            conn.pump()

    def send_multipart(self, parts: list[Any], flags: int = 0, copy: bool = True) -> None:
        """Send parts[1:] to connection parts[0]: zmq.Again while it holds HIGH_WATER unwritten, EHOSTUNREACH
        when it is gone (as a ROUTER with ROUTER_MANDATORY)."""
        conn = self.conns.get(bytes(parts[0]))
        if conn is None or conn.transport is None or conn.transport.is_closing():
            raise zmq.ZMQError(zmq.EHOSTUNREACH)
        if conn.transport.get_write_buffer_size() + len(conn.pending) > HIGH_WATER:
            raise zmq.Again()
        msg = frame_parts(parts[1:])
        size = sum(len(p) for p in msg)
        if size > COALESCE_BYTES:
            if conn.pending:  # (in order: what waits goes first)
                self._write_pending(conn)
            conn.transport.writelines(msg)
            return
        if not conn.pending:
            asyncio.get_running_loop().call_soon(self._write_pending, conn)
        for p in msg:
            conn.pending += p  # (copied: a head may be a view of a buffer that is read into again)

    def _write_pending(self, conn: _Conn) -> None:
        """Write the small messages queued for `conn` this turn of the loop, in one write."""
        data, conn.pending = conn.pending, bytearray()  # (handed over whole: never written to again)
        if data and conn.transport is not None and not conn.transport.is_closing():
            conn.transport.write(data)

    async def stop(self) -> None:
        """Stop listening and close every connection."""
        if self.server is not None:
            self.server.close()
        if self.tls_listener is not None:
            self.tls_listener.close()
        for task in list(self.handshakes):
            task.cancel()
        for conn in list(self.conns.values()):
            if conn.transport is not None:
                conn.transport.abort()
        self.conns.clear()


class LocalSockets:
    """What `Delivery` sends through: the ROUTER, or the stream connection an identity names."""

    def __init__(self, router: zmq.Socket, streams: StreamWorkers | None) -> None:
        self.router, self.streams = router, streams

    def send_multipart(self, parts: list[Any], flags: int = 0, copy: bool = True) -> None:
        if self.streams is not None and bytes(parts[0][:1]) == PREFIX:
            self.streams.send_multipart(parts, flags, copy)
        else:
            self.router.send_multipart(parts, flags, copy=copy)


async def open_streams(side: Any) -> StreamWorkers:
    """Stream connections of `side` (a LocalSide), listening beside its IPC endpoint if it has one; their messages
    go where the ROUTER's go. (Its TLS endpoint, `switch_server.localtls`, adds connections here.)"""

    def on_message(parts: list) -> None:
        try:
            side._on_message(parts)
        except Exception:
            log.exception("failed to handle a worker frame")

    streams = StreamWorkers(
        side.zap.check_stream, on_message, lambda: side.held or side.throttled, side.delivery.flush,
        lambda: side.router.maxmsgsize, side.refusals.dropped_by_zmq,
        share_budget=lambda: (side.server.budgets.shared, side.server.cfg.link.chunk_bytes),
        broke_share=side.refusals.broke_share, slot_tally=side.server.metrics.slot_bytes)
    if side.cfg.ipc_endpoint:
        await streams.start(stream_path(side.cfg.ipc_endpoint))
    return streams
