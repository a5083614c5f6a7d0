"""How a worker's I/O thread leaves its switch: the acknowledgements it owes first, then BYE, then the switch's
answer to it, then the socket closed (ZeroMQ's, or the Unix stream socket's)."""
from __future__ import annotations

__all__ = ["BYE_WAIT_S", "close_connection", "say_goodbye"]

import time
from typing import Any

import zmq

from nebula.channel.connection import poll_ms
from nebula.channel.outlet import Outlet
from nebula.channel.streams import Streams
from nebula.wire import FrameType, WireError, decode_frame, encode_frame

BYE_WAIT_S = 1.0  # how long a closing endpoint waits for its switch to answer BYE


def say_goodbye(sock: Any, streams: Streams, out: Outlet, within_s: float = 1.0) -> None:
    """Before BYE: send the acknowledgements the consumed messages owe. A receiver that consumed its last
    messages and closed at once would otherwise leave their senders waiting for ever."""
    try:
        streams.take_all_consumed()
        streams.flush_acks(force=True)
        deadline = time.monotonic() + within_s
        out.drain()
        while out.pending and time.monotonic() < deadline:
            sock.poll(10, zmq.POLLOUT)
            out.drain()
    except zmq.ZMQError:  # the socket is going anyway: nothing more to say
        pass


def close_connection(ctx: zmq.Context | None, sock: Any, monitor: Any, await_answer: bool) -> None:
    """Say BYE (freeing our rank at the switch now, so a new endpoint of this process can take it at once), wait
    for the answer when `await_answer`, and close the socket, its monitor and its context."""
    try:
        sock.send(encode_frame(FrameType.BYE), zmq.NOBLOCK)
        if await_answer:
            _await_bye(sock, BYE_WAIT_S)
        sock.linger = 500
    except zmq.ZMQError:
        pass
    if ctx is not None:
        monitor.close(0)
    sock.close()
    if ctx is not None:
        ctx.term()


def _await_bye(sock: Any, within_s: float) -> None:
    """Wait, at most `within_s`, for the switch's answer to our BYE, which says it has read everything this
    connection sent before it, our last acknowledgements included. Closing at once could lose them: a switch
    that writes to a connection already closed under it (a WELCOME, a frame for us) ends that connection
    without reading what it still held unread, and the senders of our last messages wait for ever."""
    deadline = time.monotonic() + within_s
    while (left := deadline - time.monotonic()) > 0 and sock.poll(poll_ms(left), zmq.POLLIN):
        parts = sock.recv_multipart(zmq.NOBLOCK, copy=False)
        try:
            if decode_frame(parts[0].buffer, b"").type == FrameType.BYE:
                return
        except WireError:  # (a frame with a payload, still coming in for us: unread now)
            continue
