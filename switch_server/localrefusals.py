"""Refusals of local workers' frames: counted, audited (those that only a hostile or broken worker draws, and
floods, in aggregate), and answered with an ERROR naming the problem, at most ANSWERS_PER_S a second per
connection."""
from __future__ import annotations

__all__ = ["AUDITED_REFUSALS", "Refusals"]

import logging
import time
from typing import Any, Callable

from nebula.wire import FrameType
from switch_server.answers import AnswerLimiter
from switch_server.host import LocalHost
from switch_server.registry import WorkerRegistry

log = logging.getLogger("switch_server.local")

# refusals audited: a worker trying to speak for another account, job, rank or start of its rank, acknowledging
# what was never sent to it, or sending a batch whose table lies
AUDITED_REFUSALS = frozenset({"not_attributed", "bad_incarnation", "ack_beyond_sent", "too_many_channels",
                              "bad_batch"})


class Refusals:
    """Refuses, drops and answers for the local side; `send_control` is set once its delivery exists."""

    def __init__(self, server: LocalHost, registry: WorkerRegistry, part_limit: Callable[[], int]) -> None:
        self.server, self.registry, self.part_limit = server, registry, part_limit
        self.answers = AnswerLimiter()
        self.send_control: Callable[..., None] = lambda *_a, **_k: None

    def refuse(self, ident: bytes, code: str, message: str, frame: Any = None) -> None:
        """Send an ERROR frame with `code` and `message` to the worker that sent `frame` (a connection that draws
        refusals faster than ANSWERS_PER_S gets no more answers meanwhile: counted and audited in aggregate)."""
        self.server.metrics.refused.labels(reason=code).inc()
        log.info("refused frame from worker: %s: %s", code, message)
        reg = self.registry.get(ident)
        if code in AUDITED_REFUSALS:
            self.server.audit_limited(("worker_refused", code, reg.account if reg else ""), self.server.actor,
                                      "frame_refused", f"worker:{reg.name}" if reg else "worker", "denied",
                                      {"reason": code, "detail": message[:300],
                                       "account": reg.account if reg else None})
        if not self.may_answer(ident, code):
            return
        meta: dict[str, Any] = {"code": code, "message": message}
        seq = 0
        if frame is not None and frame.type in (FrameType.DATA, FrameType.ACK):
            meta["channel"] = frame.key().to_meta()
            seq = frame.header.seq
        self.send_control(ident, FrameType.ERROR, meta, seq=seq)

    def may_answer(self, ident: bytes, why: str) -> bool:
        if self.answers.take(ident, time.monotonic()):
            return True
        self.server.metrics.refused.labels(reason="answers_limited").inc()
        reg = self.registry.get(ident)
        self.server.audit_limited(("worker_flood", why, reg.account if reg else ""), self.server.actor,
                                  "frame_refused", f"worker:{reg.name}" if reg else "worker", "denied",
                                  {"reason": "answers_limited", "frames": why, "account": reg.account if reg else None,
                                   "detail": f"a connection sent {why} frames faster than the switch answers them "
                                             "(ANSWERS_PER_S a second): the rest are read and dropped unanswered"})
        return False

    def dropped(self, account: str, code: str, message: str) -> None:
        """A frame was dropped to keep one account within its budget (its sender resends it): counted, audited
        in aggregate."""
        self.server.metrics.refused.labels(reason=code).inc()
        self.server.audit_limited(("frame_dropped", account, code), self.server.actor, "frame_dropped", account,
                                  "denied", {"reason": code, "detail": message})

    def dropped_by_zmq(self, transport: str, peer: str) -> None:
        """ZeroMQ ended a worker connection with bytes of it unread (`ConnectionWatch`): counted, audited in
        aggregate per transport."""
        limit = self.part_limit()
        self.server.metrics.refused.labels(reason="part_too_large").inc()
        log.info("ZeroMQ ended the %s connection of %s in the middle of a message", transport, peer)
        self.server.audit_limited(("connection_dropped", transport), self.server.actor, "connection_dropped",
                                  f"worker@{transport}:{peer}", "denied", {
                                      "reason": "part_too_large", "transport": transport, "peer": peer,
                                      "limit_bytes": limit,
                                      "detail": f"a message part over the local socket's limit of {limit} bytes "
                                                "(2 x link.chunk_bytes + frame head; workers split messages into "
                                                "link.chunk_bytes frames), or bytes that are not ZeroMQ framing: "
                                                "the connection was closed before the part was read"})

    def broke_share(self, transport: str, peer: str, user: str, why: str) -> None:
        """A worker's connection named its shared payloads' slots against its grant (`nebula.wire.share`): it is
        ended (its worker connects again, with empty slots); counted, audited."""
        name, _, account = user.partition("/")
        self.server.metrics.refused.labels(reason="bad_share").inc()
        log.warning("ended the %s connection of worker %s (%s): %s", transport, name, peer, why)
        self.server.audit_limited(("connection_dropped", "bad_share", account), self.server.actor,
                                  "connection_dropped", f"worker:{name}", "denied", {
                                      "reason": "bad_share", "transport": transport, "peer": peer,
                                      "account": account, "detail": why[:300]})
