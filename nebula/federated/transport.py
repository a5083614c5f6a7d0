"""The federated actors' `ActorMessenger`: `nebula.messaging.Messenger` on the channels of `actor_channels` (one per
peer, named for the controller's restarts and the clients'), receiving its role's family by default, with a fair poll
over its peers.
"""
from __future__ import annotations

import logging
import time
from typing import Collection

from nebula.channel import Endpoint
from nebula.federated.actor_channels import CHANNEL, COMBINER_RANK, ActorChannels
from nebula.federated.messages import TO_CLIENT, TO_COMBINER, TO_CONTROLLER
from nebula.messaging import PIECE_BYTES, Message, MessageFamily, Peer
from nebula.messaging import Messenger as TypedMessenger

__all__ = ["ActorMessenger", "MODEL_SLOTS"]

log = logging.getLogger(__name__)
# slots a combiner asks its switch for: one piece in 1 MiB chunks (the default), sent to every peer
# before the next, goes to the switch once (`Messenger.send_model_to`, `nebula.wire.share`)
MODEL_SLOTS = 8


class ActorMessenger(ActorChannels, TypedMessenger):
    """This actor's typed messages and models on its channels; `inbox` is the family of messages it receives
    (by default its role's: the controller's, a combiner's or a client's)."""

    def __init__(self, ep: Endpoint, piece_bytes: int = PIECE_BYTES, controller: Peer | None = None, epoch: int = 0,
                 incarnation: int = 0, inbox: MessageFamily | None = None) -> None:
        ActorChannels.__init__(self, ep, controller, epoch, incarnation)
        if inbox is None:
            inbox = TO_CONTROLLER if controller is not None and self.me == controller else \
                TO_COMBINER if self.me.rank == COMBINER_RANK else TO_CLIENT
        TypedMessenger.__init__(self, ep, inbox, piece_bytes=piece_bytes, channel=CHANNEL)

    def poll(self, peers: Collection[Peer], timeout_s: float, primary: Peer | None = None,
             wake: Collection[Peer] = ()) -> tuple[Peer, Message, list[memoryview] | None] | None:
        """The next message from any of `peers` (fair turns), or None after `timeout_s` or once one of `wake` has
        a message (`poll_parts`): a message of this actor's inbox, or Malformed. What is not a header at all (a
        piece of a model whose header was dropped) is skipped."""
        deadline = time.monotonic() + timeout_s
        while True:
            got = self.poll_parts(peers, max(0.0, deadline - time.monotonic()), primary, wake)
            if got is None:
                return None
            peer, parts = got
            try:
                msg, rest = self.decode(parts, peer)
            except ValueError as exc:
                log.warning("skipping a message from %s: %s", peer, exc)
                if time.monotonic() >= deadline:
                    return None
                continue
            return peer, msg, rest
