"""The sending side of a worker's socket: frames wait in lanes and leave by lane priority, each payload through
the shared-memory arena when it fits there, else inline."""
from __future__ import annotations

import time
from collections import deque
from typing import Any, Iterable

import zmq

from nebula.channel.arena import ArenaClient, Pieces
from nebula.channel.delivery import OutFrame
from nebula.wire import Lane, next_lane
from nebula.wire.header import chunk_of
from nebula.wire.shm import SHM_TAG

__all__ = ["Outlet"]


class Outlet:
    """Lane queues in front of one ZeroMQ socket (which holds at most its SNDHWM frames itself)."""

    def __init__(self, sock: zmq.Socket, shm: ArenaClient) -> None:
        self.sock, self.shm = sock, shm
        self.sharing = hasattr(sock, "send_shared")  # a stream connection (`nebula.wire.share`), not ZeroMQ
        self.lanes: tuple[deque[OutFrame], ...] = tuple(deque() for _ in Lane)
        self.turn = 0

    @property
    def pending(self) -> bool:
        """Whether frames wait in a lane for the socket (and not merely for room in the arena)."""
        return any(self.lanes) and not self.shm.waiting

    def push(self, lane: Lane, frames: Iterable[OutFrame]) -> None:
        """Queue frames on `lane`, behind what waits there."""
        self.lanes[lane].extend(frames)

    def control(self, head: bytes) -> None:
        """Queue a control frame without payload (ACK, SHM_RELEASE)."""
        self.lanes[Lane.CONTROL].append(OutFrame(head, b"", None))

    def send_now(self, head: bytes, payload: Any, msg: Any = None) -> bool:
        """Hand one frame to the socket without blocking; False when it (or the arena) has no room now. A frame of
        a shared message (`OutMessage.share`) goes through the connection's slots where it has some."""
        n = len(payload)
        if self.sharing and msg is not None and msg.share is not None and self.sock.share is not None \
                and self.sock.share.fits(n):
            try:
                self.sock.send_shared(head, payload, (msg.share, chunk_of(head), n))
                return True
            except zmq.Again:
                return False
        shm = self.shm
        if shm.fits(n) and self.sock.get(zmq.EVENTS) & zmq.POLLOUT:
            placed = shm.put(payload, time.monotonic())
            if placed is False:
                return False
            if placed is not True:
                desc, off = placed
                try:
                    self.sock.send_multipart((head, SHM_TAG, desc), zmq.NOBLOCK)
                    return True
                except zmq.Again:
                    shm.unput(off)
                    return False
        try:
            if n:
                if isinstance(payload, Pieces):
                    payload = payload.join()
                self.sock.send_multipart((head, payload), zmq.NOBLOCK, copy=n < 65536)
            else:
                self.sock.send(head, zmq.NOBLOCK)
            return True
        except zmq.Again:
            return False

    def drain(self) -> None:
        """Send queued frames by the lane rule (`nebula.wire.next_lane`) until the socket has no room or the
        lanes are empty."""
        lanes = self.lanes
        self.shm.waiting = False
        while True:
            lane, self.turn = next_lane(lanes, self.turn)
            if lane < 0:
                return
            q = lanes[lane]
            head, payload, msg = q[0]
            if not self.send_now(head, payload, msg):
                return
            q.popleft()
            if msg is not None:
                msg.frame_sent(time.monotonic())
