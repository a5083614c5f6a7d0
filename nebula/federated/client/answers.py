"""What every client task waits on: its combiner's answers (`Answers`), filtered to this process (`for_me`), from
everyone a client listens to (`mb_peers`)."""
from __future__ import annotations

import logging
import time
from typing import Any

from nebula.federated.actor_channels import COMBINER_RANK, CONTROLLER_RANK
from nebula.federated.config import FederatedJob
from nebula.federated.messages import ANY_START, GetParameters, Stop, TrainTask, UpdateDropped
from nebula.federated.transport import ActorMessenger
from nebula.messaging import Message, Peer

__all__ = ["Answers", "mb_peers", "for_me"]

log = logging.getLogger(__name__)


def mb_peers(job: FederatedJob) -> list[Peer]:
    """Everyone a client listens to: every combiner and the controller."""
    return [*(Peer(c.id, COMBINER_RANK) for c in job.clusters), Peer(job.controller.cluster, CONTROLLER_RANK)]


def for_me(msg: Message, nonce: str, me: str, peer: Peer) -> bool:
    """Whether a message is addressed to this process (a stop may also be to any process of this incarnation)."""
    to = getattr(msg, "to", None)
    if to == nonce or (to == ANY_START and isinstance(msg, Stop)):
        return True
    log.info("%s: ignoring a %s from %s addressed to another process (%s)", me, msg.TYPE[:32] or "malformed message",
             peer, str(to)[:32])
    return False


class Answers:
    """The answers of combiner `peer` to what this client sent for a task."""

    def __init__(self, mb: ActorMessenger, peer: Peer, job: FederatedJob, me: str, nonce: str) -> None:
        self.mb, self.peer, self.me, self.nonce = mb, peer, me, nonce
        self.others = [p for p in mb_peers(job) if p != peer]

    def wait(self, want: tuple[type, ...], deadline: float, what: str) -> tuple[str, Any]:
        """("ok", (message, parts)) for the next of the `want` types; ("pending", poll result) for a message that
        ends the wait and is to be served next (a new task or a stop, the controller's request); ("dropped", its
        refusal); ("timeout", None)."""
        mb, peer = self.mb, self.peer
        while time.monotonic() < deadline:
            got = mb.poll([peer, *self.others], min(1.0, max(0.0, deadline - time.monotonic())), primary=peer)
            if got is None:
                continue
            src, answer, parts = got
            if isinstance(answer, GetParameters):
                return "pending", got
            if not for_me(answer, self.nonce, self.me, src):
                continue
            if src != peer:  # another combiner (ours is gone, we were reassigned)
                if isinstance(answer, (TrainTask, Stop)):
                    return "pending", got
                continue
            if isinstance(answer, want):
                return "ok", (answer, parts)
            if isinstance(answer, UpdateDropped):
                log.warning("%s: %s refused: %s", self.me, what, answer.reason)
                return "dropped", answer
            if isinstance(answer, (TrainTask, Stop)):  # the round moved on without us
                return "pending", got
        log.warning("%s: combiner %s did not answer the %s", self.me, peer, what)
        return "timeout", None
