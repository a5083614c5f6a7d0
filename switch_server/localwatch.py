"""Evidence of worker connections that ZeroMQ itself ends on the local socket.

A message part over the socket's ZMQ_MAXMSGSIZE ends its connection inside libzmq, before the switch sees a
frame. libzmq's monitor reports that as EVENT_DISCONNECTED, exactly as it reports a worker closing its end
(checked: libzmq 4.3.5 emits no other event for it). What tells them apart is the TCP or Unix socket itself: a
worker that closes has had everything it sent read (libzmq reads up to the end of the stream before it sees the
close), whereas a connection ended mid-message holds unread bytes, or receives them soon (the rest of the part
the worker is still sending). So the watch keeps a duplicate of each accepted connection's descriptor (the socket
stays inspectable after libzmq closes its own) and, at the disconnect, looks for unread bytes without consuming
them. Costs: two monitor events and one `dup` per connection, nothing per message.
"""
from __future__ import annotations

__all__ = ["ConnectionWatch"]

import asyncio
import logging
import os
import socket
import struct
from typing import Callable

import zmq
from zmq.utils.monitor import parse_monitor_message

log = logging.getLogger(__name__)

MAX_WATCHED = 256  # connections watched at once: a connection flood must not double the descriptors held
SETTLE_S = 1.0  # how long an ended connection's worker may take to send more (or close) before it is judged


class ConnectionWatch:
    """Monitors a ROUTER socket's connections; calls `dropped(transport, peer)` for each one that libzmq ended
    with bytes of the worker's still unread (a part over ZMQ_MAXMSGSIZE, or bytes that are not ZMTP)."""

    def __init__(self, router: zmq.Socket, dropped: Callable[[str, str], None]) -> None:
        self.dropped = dropped
        self._owner = router.get_monitor_socket(zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED)
        self._mon: zmq.Socket | None = zmq.Socket.shadow(self._owner.underlying)  # synchronous view: no futures
        self._router = router
        self._watched: dict[int, tuple[socket.socket, str, str]] = {}  # libzmq's fd -> (our dup, transport, peer)
        self._settling: dict[socket.socket, asyncio.TimerHandle] = {}  # ended, waiting for the worker's next bytes
        asyncio.get_running_loop().add_reader(self._mon.FD, self.drain)

    def drain(self) -> None:
        """Handle every queued monitor event (the FD signals edges only; also called periodically)."""
        mon = self._mon
        if mon is None:
            return
        events = []
        while mon.get(zmq.EVENTS) & zmq.POLLIN:
            events.append(parse_monitor_message(mon.recv_multipart(zmq.NOBLOCK)))
        last_end = {e["value"]: i for i, e in enumerate(events) if e["event"] == zmq.EVENT_DISCONNECTED}
        for i, ev in enumerate(events):
            fd = ev["value"]
            if ev["event"] == zmq.EVENT_ACCEPTED:
                # a connection already gone may have left its descriptor number to another file: not watched
                if last_end.get(fd, -1) < i:
                    self._watch(fd, ev["endpoint"].decode(errors="replace"))
            else:
                self._judge(fd)

    def _watch(self, fd: int, endpoint: str) -> None:
        old = self._watched.pop(fd, None)
        if old is not None:
            old[0].close()
        if len(self._watched) + len(self._settling) >= MAX_WATCHED:
            return
        try:
            dup = os.dup(fd)
        except OSError:
            return
        try:
            s = socket.socket(fileno=dup)
        except OSError:  # (not a socket: the descriptor number went to another file meanwhile)
            os.close(dup)
            return
        transport = endpoint.partition("://")[0]
        try:
            if s.family == socket.AF_UNIX:
                pid, uid, _ = struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
                peer = f"pid {pid} uid {uid}"
            else:
                host, port = s.getpeername()[:2]
                peer = f"{host}:{port}"
        except OSError:
            peer = "?"
        self._watched[fd] = (s, transport, peer)

    def _judge(self, fd: int) -> None:
        entry = self._watched.pop(fd, None)
        if entry is None:
            return
        s = entry[0]
        try:
            same = os.fstat(fd).st_ino == os.fstat(s.fileno()).st_ino
        except OSError:
            same = False  # libzmq's descriptor is closed: our dup is the ended connection
        if same:  # libzmq still holds this socket: our dup is of a later connection, not the ended one
            s.close()
            return
        self._settle(entry)

    def _settle(self, entry: tuple[socket.socket, str, str], waited: bool = False) -> None:
        """Report the ended connection if bytes of the worker are unread. While the worker is still connected and
        nothing is unread yet (libzmq may have read all that had arrived), wait until its next bytes or its close
        arrive, up to SETTLE_S."""
        s, transport, peer = entry
        loop = asyncio.get_running_loop()
        try:
            unread = s.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            if not waited:
                self._settling[s] = loop.call_later(SETTLE_S, self._give_up, s)
                loop.add_reader(s.fileno(), self._settled, entry)
                return
            unread = b""
        except OSError:
            unread = b""  # reset by the worker
        if unread:
            self.dropped(transport, peer)
        s.close()

    def _settled(self, entry: tuple[socket.socket, str, str]) -> None:
        s = entry[0]
        self._give_up(s, close=False)
        self._settle(entry, waited=True)

    def _give_up(self, s: socket.socket, close: bool = True) -> None:
        timer = self._settling.pop(s, None)
        if timer is not None:
            timer.cancel()
            asyncio.get_running_loop().remove_reader(s.fileno())
        if close:
            s.close()

    def close(self) -> None:
        """Stop monitoring; release the descriptors held."""
        if self._mon is None:
            return
        asyncio.get_running_loop().remove_reader(self._mon.FD)
        try:
            self._router.disable_monitor()
        except zmq.ZMQError:
            pass
        self._mon = None
        self._owner.close(0)
        for s in list(self._settling):
            self._give_up(s)
        for s, _, _ in self._watched.values():
            s.close()
        self._watched.clear()
