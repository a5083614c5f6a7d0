"""The recovery agreement's messages, as frozen dataclasses, and their family on the wire (`TO_RECOVERY`, written
and read by `nebula.messaging`'s one encoder and decoder).

A cluster's *incarnation* is (count, nonce): count is the number of times the cluster was launched (kept on its own
disk, never a clock), the nonce a random number drawn at launch that tells apart two launches that read the same
count. A *round* is (epoch, view): epoch counts the recoveries begun, the view holds the newest incarnation known of
every cluster, in the job's cluster order. Every message names its round; a round only grows (epoch by max, view by
the newer incarnation of each cluster), so a message of an older round or of an older incarnation is recognised as
such by every receiver.

    Holdings(job, sender, round, steps)   "I stopped at my boundary; these are my committed, verified checkpoints"
    Decided(job, sender, round, step)     "with everyone's holdings of this round, the newest common step is this"
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, fields
from typing import Any, Union

from nebula.messaging import Message as WireMessage
from nebula.messaging import MessageFamily, ProtocolError, Untrusted, to_json
from nebula.messaging import decode as decode_wire

__all__ = ["RecoveryRefused", "Incarnation", "UNKNOWN", "Round", "Holdings", "Decided", "RecoveryMessage",
           "encode_recovery", "decode_recovery", "MAX_STEPS", "MAX_BYTES", "TO_RECOVERY", "HoldingsWire", "DecidedWire"]

MAX_STEPS = 1024  # steps one cluster may report (it keeps checkpoint.keep of them)
MAX_STEP = (1 << 62) - 1
MAX_COUNT = (1 << 62) - 1
MAX_NONCE = (1 << 63) - 1
MAX_BYTES = 64 * 1024  # a message of 64 clusters and 1024 steps is about 20 KB
MAX_CLUSTERS = 64


class RecoveryRefused(ValueError):
    """A recovery message that does not follow the protocol; the text names the field and the value."""


def _int(v: Any, what: str, lo: int, hi: int) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise RecoveryRefused(f"{what} must be an integer in [{lo}, {hi}], got {v!r:.40}")
    return v


@dataclass(frozen=True, slots=True, order=True)
class Incarnation:
    """One launch of a cluster; later launches compare greater (count first, then nonce)."""

    count: int  # launches of the cluster so far; 0: not known yet
    nonce: int  # random, drawn at launch

    def __post_init__(self) -> None:
        _int(self.count, "incarnation count", 0, MAX_COUNT)
        _int(self.nonce, "incarnation nonce", 0, MAX_NONCE)


UNKNOWN = Incarnation(0, 0)


@dataclass(frozen=True, slots=True)
class Round:
    """A recovery round: the recoveries begun so far and the newest known incarnation of each cluster."""

    epoch: int
    view: tuple[Incarnation, ...]

    def __post_init__(self) -> None:
        _int(self.epoch, "round epoch", 0, MAX_COUNT)
        if not 1 <= len(self.view) <= MAX_CLUSTERS or not all(isinstance(i, Incarnation) for i in self.view):
            raise RecoveryRefused(f"round view must hold 1 to {MAX_CLUSTERS} incarnations")

    def merge(self, other: Round) -> Round:
        """The round that follows both: the larger epoch, the newer incarnation of each cluster."""
        if len(other.view) != len(self.view):
            raise RecoveryRefused(f"round view of {len(other.view)} clusters, expected {len(self.view)}")
        return Round(max(self.epoch, other.epoch), tuple(max(a, b) for a, b in zip(self.view, other.view)))

    def with_incarnation(self, index: int, inc: Incarnation) -> Round:
        return Round(self.epoch, self.view[:index] + (inc,) + self.view[index + 1:])

    @property
    def tag(self) -> str:
        """A short name of this round, the same on every cluster (`r<epoch>-<digest of the view>`): channels named
        with it are new in every round, so nothing sent in an abandoned round is read in the next. The view is part
        of it because a round can keep its epoch and gain a newer launch of a cluster."""
        view = ",".join(f"{i.count}:{i.nonce}" for i in self.view)
        return f"r{self.epoch}-{hashlib.sha256(view.encode()).hexdigest()[:8]}"


@dataclass(frozen=True, slots=True)
class Holdings:
    """A cluster stopped at its step boundary in `round` and holds checkpoints of `steps` (ascending)."""

    job: str
    sender: str
    round: Round
    steps: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.steps) > MAX_STEPS:
            raise RecoveryRefused(f"holdings of {self.sender} list {len(self.steps)} steps, at most {MAX_STEPS}")
        for s in self.steps:
            _int(s, "holdings step", 0, MAX_STEP)
        if any(a >= b for a, b in zip(self.steps, self.steps[1:])):
            raise RecoveryRefused(f"holdings steps of {self.sender} must be strictly ascending")


@dataclass(frozen=True, slots=True)
class Decided:
    """The newest step every cluster holds in `round`, as `sender` computed it (-1: none, start from scratch)."""

    job: str
    sender: str
    round: Round
    step: int

    def __post_init__(self) -> None:
        _int(self.step, "decided step", -1, MAX_STEP)


RecoveryMessage = Union[Holdings, Decided]

TO_RECOVERY = MessageFamily("recovery")  # what one cluster's recovery driver sends another's


@TO_RECOVERY.message("holdings")
class HoldingsWire(WireMessage):
    """`Holdings` on the wire: the round as its epoch and its view of [count, nonce] pairs in the job's cluster
    order. The round and the steps are kept as sent: `decode_recovery` checks them with the rules of `Round` and
    `Holdings`."""

    job: str
    sender: str
    epoch: Untrusted
    view: Untrusted
    steps: Untrusted


@TO_RECOVERY.message("decided")
class DecidedWire(WireMessage):
    """`Decided` on the wire (the round as in `HoldingsWire`)."""

    job: str
    sender: str
    epoch: Untrusted
    view: Untrusted
    step: Untrusted


def encode_recovery(msg: RecoveryMessage, clusters: tuple[str, ...]) -> bytes:
    """The message as compact JSON (the view as [count, nonce] pairs in the job's cluster order)."""
    if len(msg.round.view) != len(clusters):
        raise ValueError(f"round of {len(msg.round.view)} clusters for a job of {len(clusters)}")
    view = tuple((i.count, i.nonce) for i in msg.round.view)
    if isinstance(msg, Holdings):
        return to_json(HoldingsWire(job=msg.job, sender=msg.sender, epoch=msg.round.epoch, view=view,
                                    steps=msg.steps))
    return to_json(DecidedWire(job=msg.job, sender=msg.sender, epoch=msg.round.epoch, view=view, step=msg.step))


def decode_recovery(data: bytes, *, job: str, clusters: tuple[str, ...], sender: str) -> RecoveryMessage:
    """A message from cluster `sender` (as the switch authenticated it) of `job`; RecoveryRefused names what is
    wrong: size, JSON, type, keys, job, sender, view length, a sender that does not know its own incarnation."""
    if sender not in clusters:
        raise RecoveryRefused(f"recovery message from cluster {sender!r:.80}, which is not one of {list(clusters)}")
    if len(data) > MAX_BYTES:
        raise RecoveryRefused(f"recovery message of {len(data)} bytes from {sender}, at most {MAX_BYTES}")
    try:
        doc = json.loads(bytes(data))
    except ValueError:
        raise RecoveryRefused(f"recovery message from {sender} is not JSON") from None
    kind = doc.get("type") if isinstance(doc, dict) else None
    if not isinstance(kind, str) or kind not in TO_RECOVERY.types:
        raise RecoveryRefused(f"recovery message from {sender} has no known type (holdings, decided)")
    keys, want = set(doc), {"type", *(f.name for f in fields(TO_RECOVERY.types.get(kind)) if f.name != "model")}
    if keys != want:  # (a model's layout is no field of a recovery message either)
        raise RecoveryRefused(f"recovery {kind} from {sender}: keys {sorted(keys ^ want)} are unexpected or missing")
    try:
        msg = decode_wire(doc, TO_RECOVERY)
    except ProtocolError as exc:
        raise RecoveryRefused(f"recovery message from {sender}: {exc}") from None
    if msg.job != job:
        raise RecoveryRefused(f"recovery message from {sender} is for job {msg.job!r:.80}, this is {job!r}")
    if msg.sender != sender:
        raise RecoveryRefused(f"recovery message from cluster {sender} names sender {msg.sender!r:.80}")
    view = msg.view
    if not isinstance(view, list) or len(view) != len(clusters) or not all(
            isinstance(p, list) and len(p) == 2 for p in view):
        raise RecoveryRefused(f"recovery message from {sender}: view must be {len(clusters)} [count, nonce] pairs")
    rnd = Round(_int(msg.epoch, "epoch", 0, MAX_COUNT), tuple(Incarnation(c, n) for c, n in view))
    if rnd.view[clusters.index(sender)].count < 1:
        raise RecoveryRefused(f"recovery message from {sender} does not name its own incarnation")
    if isinstance(msg, HoldingsWire):
        if not isinstance(msg.steps, list):
            raise RecoveryRefused(f"recovery holdings from {sender}: steps must be a list")
        return Holdings(job, sender, rnd, tuple(msg.steps))
    return Decided(job, sender, rnd, msg.step)
