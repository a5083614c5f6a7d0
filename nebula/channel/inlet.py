"""The receiving side of a worker's socket: frames read in batches, payloads from the shared-memory arena or
inline, parsed strictly."""
from __future__ import annotations

import logging
from typing import Any, Callable

import zmq

from nebula.channel.arena import ArenaClient
from nebula.wire import WireError, decode_frame
from nebula.wire.shm import SHM_TAG

__all__ = ["receive_all"]

log = logging.getLogger("nebula.channel.io")


def receive_all(sock: zmq.Socket, shm: ArenaClient, on_frame: Callable[..., Any]) -> None:
    """Take every frame waiting on `sock` (without blocking) and hand each to `on_frame(frame, payload, region)`;
    what is malformed or unusable is logged and dropped, its shared-memory region handed back."""
    while True:
        try:
            parts = sock.recv_multipart(zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return
        region = None
        if len(parts) == 3 and parts[1].bytes == SHM_TAG:
            try:
                payload, region = shm.payload(parts[2].buffer)
            except WireError as exc:
                log.warning("switch sent a bad shared-memory descriptor (%s); ignored", exc)
                continue
        elif len(parts) in (1, 2):
            payload = parts[1].buffer if len(parts) == 2 else b""
        else:
            log.warning("switch sent a message of %d parts; ignored", len(parts))
            continue
        try:
            frame = decode_frame(parts[0].buffer, payload)
        except WireError as exc:
            log.warning("switch sent a malformed frame (%s); ignored", exc)
            shm.release(region)
            continue
        try:
            on_frame(frame, payload, region)
        except WireError as exc:  # a frame type workers do not take, or meta its handler cannot use
            log.warning("switch sent a frame this worker cannot use (%s); ignored", exc)
            shm.release(region)
