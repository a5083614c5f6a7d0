"""Local workers' connections: registration by HELLO (through `switch_server.hello.HelloDesk`), BYE, the end of a
connection, and the payloads and releases of their shared-memory arenas."""
from __future__ import annotations

__all__ = ["WorkerConnections"]

import logging
import time
from typing import Any, Callable

from nebula.wire import ChannelKey, Frame, FrameType
from nebula.wire.shm import SHM_MIN_BYTES
from switch_server.delivery import Delivery
from switch_server.hello import HelloDesk
from switch_server.host import LocalHost
from switch_server.localrefusals import Refusals
from switch_server.localshm import WorkerShm
from switch_server.registry import Registration, WorkerRegistry

log = logging.getLogger("switch_server.local")


class WorkerConnections:
    """What the local side knows of each worker connection, and how it joins and leaves."""

    def __init__(self, server: LocalHost, registry: WorkerRegistry, refusals: Refusals, desk: HelloDesk,
                 delivery: Delivery) -> None:
        self.server, self.registry, self.refusals, self.desk = server, registry, refusals, desk
        self.delivery = delivery
        self.refuse = refusals.refuse
        self.send_control, self.flush = delivery.send_control, delivery.flush
        # whether a connection may share memory with the switch (not one over TLS from another host: set by
        # `switch_server.localtls`)
        self.same_host: Callable[[bytes], bool] = lambda ident: True

    def registered(self, ident: bytes, frame: Frame) -> Registration | None:
        reg = self.registry.get(ident)
        if reg is None:
            self.refuse(ident, "no_hello", "send HELLO (job, rank) before any other frame", frame)
            return None
        reg.last_seen = time.monotonic()
        return reg

    def on_bye(self, _frame: Frame, ident: bytes, *_: Any) -> None:
        reg = self.registry.get(ident)
        if reg is None and not self.refusals.may_answer(ident, "bye"):
            return
        self.delivery.say_bye(ident)
        if reg is not None:
            self.forget(ident)
            self.server.incarnation_ended(reg.account, reg.job, reg.rank, reg.inc)

    def on_shm_release(self, frame: Frame, ident: bytes, *_: Any) -> None:
        reg = self.registered(ident, frame)
        if reg is not None and reg.shm is not None and frame.meta["token"] == reg.shm.arena.token:
            for off in frame.meta["offsets"]:
                reg.shm.down_free(off)

    def place(self, key: ChannelKey, nbytes: int) -> memoryview | None:
        """A region of the arena of the local worker that a peer's payload of `nbytes` on channel `key` is for, to
        read it into (None: not one of ours, not connected, no arena, or no room in it now)."""
        if key.dst_cluster != self.server.cfg.cluster or nbytes < SHM_MIN_BYTES:
            return None
        ident = self.registry.by_addr.get((key.account, key.job, key.dst_rank))
        shm = self.ready_shm(ident) if ident is not None else None
        return shm.place(nbytes) if shm is not None else None

    def shm_payload(self, ident: bytes, desc: memoryview) -> memoryview | None:
        """The payload a worker placed in its arena; None if stale (sent before a switch restart, or into an arena
        since replaced: the worker sends those messages again); WireError if the descriptor is unsound."""
        reg = self.registry.get(ident)
        payload = reg.shm.up_payload(desc) if reg is not None and reg.shm is not None else None
        if payload is None:
            self.server.metrics.refused.labels(reason="stale_shm").inc()
            log.info("dropped a frame in a shared-memory arena this connection no longer has")
            return None
        self.server.metrics.shm_bytes["in"] += len(payload)
        return payload

    def on_hello(self, frame: Frame, ident: bytes, name: str, account: str, *_: Any) -> None:
        taken = self.desk.take(frame, ident, name, account)
        if taken is None:
            return
        reg, new, replaced = taken
        if replaced is not None:
            self.forget(replaced.ident)
            if replaced.inc != reg.inc:  # a new start of the rank: what its predecessor sent expires
                self.server.incarnation_ended(replaced.account, replaced.job, replaced.rank, replaced.inc)
        # the WELCOME first: it names the worker's incarnation, and frames held for its rank may be on the control
        # lane too (queued before it there, they would reach a worker that does not know who it is yet)
        mapped = frame.meta.get("shm") if self.same_host(ident) else None
        self.send_control(ident, FrameType.WELCOME, self.desk.welcome(reg, mapped))
        if new:
            self.server.metrics.workers.set(len(self.registry))
            self.delivery.adopt(reg.addr, ident)
        self.flush(ident)

    def ready_shm(self, ident: bytes) -> WorkerShm | None:
        reg = self.registry.get(ident)
        return reg.shm if reg is not None and reg.shm is not None and reg.shm.ready else None

    def forget_silent(self, silent_s: float) -> None:
        """Forget the registrations of workers silent for more than `silent_s`: their starts have ended."""
        now = time.monotonic()
        for reg in self.registry:  # (a copy: forgetting is safe while iterating)
            if now - reg.last_seen > silent_s:
                self.forget(reg.ident)
                self.server.incarnation_ended(reg.account, reg.job, reg.rank, reg.inc)

    def forget(self, ident: bytes) -> None:
        reg = self.registry.remove(ident)
        if reg is not None and reg.shm is not None:
            reg.shm.close()
        self.delivery.drop(ident, reg.addr if reg is not None else None)
        self.server.metrics.workers.set(len(self.registry))
