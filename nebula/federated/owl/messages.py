"""OWL's messages on the channel `owl` between every pair of actors (nebula.messaging: the groups' tensors and the
updates as models, inline or in pieces, `Messenger.send_model`). `TO_WORKER`: what the server and peers send a
worker; `TO_SERVER`: what workers send the server."""
from __future__ import annotations


from nebula.federated.messages import Stop
from nebula.messaging import Message, MessageFamily

__all__ = ["TO_WORKER", "TO_SERVER", "DeployPlan", "ModelGroup", "OwlUpdate", "GroupPull", "Stop"]

TO_WORKER = MessageFamily("owl worker")
TO_SERVER = MessageFamily("owl server")
MAX_WORKERS = 100_000  # more than any deployment; a peer's list longer than this is refused before it is walked


def _natural(name: str, value: int, least: int = 0) -> None:
    """ValueError (a refusal, as the decoder reports it) unless `value` >= `least`: the static bound of a field a
    peer chooses; what depends on the receiver's state (a group index, a round) its handler checks."""
    if value < least:
        raise ValueError(f"{name}={value} must be >= {least}")


@TO_WORKER.message("plan")
class DeployPlan(Message):
    """The deploy setting, once: the workers (cluster/rank, in order), how updates are combined, the groups of
    branches and, per worker, which groups it pulls from where (the server, or a worker's index)."""

    workers: tuple[str, ...]
    combine: str = "server"
    groups: tuple[tuple[int, ...], ...]
    pulls: tuple[tuple[tuple[int, int], ...], ...]
    rounds: int

    def __post_init__(self) -> None:
        _natural("rounds", self.rounds, 1)
        if not 1 <= len(self.workers) <= MAX_WORKERS or len(self.pulls) != len(self.workers):
            raise ValueError(f"{len(self.workers)} workers with {len(self.pulls)} pull lists; expected one "
                             f"list per worker (1..{MAX_WORKERS})")
        if self.combine not in ("server", "cluster"):
            raise ValueError(f"combine={self.combine[:32]!r}; expected 'server' or 'cluster'")
        bad = next((w for w in self.workers if w.count("/") != 1 or not w.split("/")[1].isdigit()), None)
        if bad is not None:
            raise ValueError(f"worker {bad[:64]!r} is not cluster/rank")
        n, d = len(self.workers), len(self.groups)
        for ps in self.pulls:
            for g, src in ps:
                if not (0 <= g < d and -1 <= src < n):
                    raise ValueError(f"pull ({g}, {src}) names a group outside 0..{d - 1} or a source outside "
                                     f"-1..{n - 1}")


@TO_WORKER.message("group")
class ModelGroup(Message):
    """One group of the round's model (its tensors follow as arrays), from the server or forwarded by a peer."""

    round: int
    group: int

    def __post_init__(self) -> None:
        _natural("round", self.round)
        _natural("group", self.group)


@TO_SERVER.message("update")
@TO_WORKER.message("update")
class OwlUpdate(Message):
    """A worker's model after its local steps (arrays), or a cluster's average of `num_updates` of them."""

    round: int
    num_examples: int
    num_updates: int = 1

    def __post_init__(self) -> None:
        _natural("round", self.round)
        _natural("num_examples", self.num_examples, 1)
        _natural("num_updates", self.num_updates, 1)


@TO_SERVER.message("pull")
class GroupPull(Message):
    """A peer has not forwarded these groups within peer_timeout_s: the server sends them itself."""

    round: int
    groups: tuple[int, ...]

    def __post_init__(self) -> None:
        _natural("round", self.round)
        if not self.groups or len(set(self.groups)) != len(self.groups) or min(self.groups) < 0:
            raise ValueError(f"groups={list(self.groups)[:8]} must be distinct group indices >= 0, at least one")


TO_WORKER.message("stop")(Stop)
