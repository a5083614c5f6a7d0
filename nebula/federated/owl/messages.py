"""OWL's messages on the channel `owl` between every pair of actors (nebula.messaging: the groups' tensors and the
updates as models, inline or in pieces, `Messenger.send_model`). `TO_WORKER`: what the server and peers send a
worker; `TO_SERVER`: what workers send the server."""
from __future__ import annotations


from nebula.federated.messages import Stop
from nebula.messaging import Message, MessageFamily

__all__ = ["TO_WORKER", "TO_SERVER", "Plan", "Group", "OwlUpdate", "GroupPull", "Stop"]

TO_WORKER = MessageFamily("owl worker")
TO_SERVER = MessageFamily("owl server")


@TO_WORKER.message("plan")
class Plan(Message):
    """The deploy setting, once: the workers (cluster/rank, in order), how updates are combined, the groups of
    branches and, per worker, which groups it pulls from where (the server, or a worker's index)."""

    workers: tuple[str, ...]
    combine: str = "server"
    groups: tuple[tuple[int, ...], ...]
    pulls: tuple[tuple[tuple[int, int], ...], ...]
    rounds: int


@TO_WORKER.message("group")
class Group(Message):
    """One group of the round's model (its tensors follow as arrays), from the server or forwarded by a peer."""

    round: int
    group: int


@TO_SERVER.message("update")
@TO_WORKER.message("update")
class OwlUpdate(Message):
    """A worker's model after its local steps (arrays), or a cluster's average of `num_updates` of them."""

    round: int
    num_examples: int
    num_updates: int = 1


@TO_SERVER.message("pull")
class GroupPull(Message):
    """A peer has not forwarded these groups within peer_timeout_s: the server sends them itself."""

    round: int
    groups: tuple[int, ...]


TO_WORKER.message("stop")(Stop)
