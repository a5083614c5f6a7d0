"""One cluster's side of the recovery agreement, as a pure state machine: events in, actions out. No sockets and no
clock: the driver passes its own monotonic time with every event, and nothing is compared across hosts.

Phases: `new` (launched, not started) -> `recovering` (stopped at its boundary, exchanging holdings) -> `running`
(resumed) -> `pausing` (another cluster began a recovery: stop at the next boundary) -> `recovering` ... and `over`
(gave up or superseded). In a round, every cluster sends its Holdings to every other; once a cluster has all of
them it computes the newest step all hold (-1: none) and sends Decided; once it has every cluster's Decided of the
round (all equal) it resumes. A newer round (a recovery begun elsewhere, a cluster launched again) replaces the
current one wherever it arrives, so a cluster that died again during a recovery only moves everyone to the next
round. Messages of older rounds and of older incarnations, and second copies, change nothing.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from nebula.recovery.messages import UNKNOWN, Decided, Holdings, Incarnation, RecoveryMessage, Round

__all__ = ["Started", "Paused", "Received", "Tick", "Event", "Send", "RequestPause", "Resume", "Renumbered",
           "GiveUp", "Superseded", "Action", "Agreement", "RESTART_HINT"]

RESTART_HINT = "Restart all clusters of the job: they resume from the last common checkpoint"


# ---- events -------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Started:
    """A fresh launch, before its first step: agree on where to start (`steps`: its verified checkpoints)."""

    steps: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Paused:
    """The runtime stopped at its step boundary, because it lost `lost` or because it was asked to."""

    steps: tuple[int, ...]
    lost: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Received:
    """A message from another cluster's coordinator (decoded and checked against its channel's cluster)."""

    message: RecoveryMessage


@dataclass(frozen=True, slots=True)
class Tick:
    """Time passed (for the bound on waiting)."""


Event = Union[Started, Paused, Received, Tick]


# ---- actions ------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Send:
    to: str
    message: RecoveryMessage


@dataclass(frozen=True, slots=True)
class RequestPause:
    """Stop training at the next step boundary, then report Paused."""

    reason: str


@dataclass(frozen=True, slots=True)
class Resume:
    """Load checkpoint `step` (-1: start from scratch) and train on from there."""

    step: int
    round: Round


@dataclass(frozen=True, slots=True)
class Renumbered:
    """This launch took a higher incarnation count than its disk said (keep it for the next launch)."""

    incarnation: Incarnation


@dataclass(frozen=True, slots=True)
class GiveUp:
    """The recovery cannot finish: exit 3 with `message` (`cluster`: the one that did not come back)."""

    cluster: str
    message: str


@dataclass(frozen=True, slots=True)
class Superseded:
    """A newer launch of this cluster took part: this process must stop."""

    message: str


Action = Union[Send, RequestPause, Resume, Renumbered, GiveUp, Superseded]


@dataclass
class Agreement:
    """The agreement state of cluster `me` of `job` (clusters in the job's order), launched as `incarnation`."""

    job: str
    clusters: tuple[str, ...]
    me: str
    incarnation: Incarnation
    timeout_s: float
    phase: str = "new"
    round: Round = field(init=False)
    steps: tuple[int, ...] = ()
    holdings: dict[str, tuple[int, ...]] = field(default_factory=dict)
    decided: dict[str, int] = field(default_factory=dict)
    lost: set[str] = field(default_factory=set)
    deadline: float | None = None
    fresh: bool = True  # not resumed yet: a higher incarnation of this cluster seen now is an older launch's

    def __post_init__(self) -> None:
        if self.me not in self.clusters or len(set(self.clusters)) != len(self.clusters):
            raise ValueError(f"cluster {self.me!r} must be one of the job's distinct clusters {list(self.clusters)}")
        if self.incarnation.count < 1:
            raise ValueError("an incarnation's count starts at 1 (the first launch)")
        if not self.timeout_s > 0:
            raise ValueError(f"recovery_timeout_s={self.timeout_s} must be > 0")
        self._i = self.clusters.index(self.me)
        self.round = Round(0, tuple(self.incarnation if c == self.me else UNKNOWN for c in self.clusters))

    # ---- entry point ------------------------------------------------------------------------------------------
    def handle(self, event: Event, now: float) -> list[Action]:
        """The actions that follow `event` at local monotonic time `now`."""
        if self.phase == "over":
            return []
        if isinstance(event, Received):
            return self._received(event.message, now)
        if isinstance(event, Tick):
            return self._tick(now)
        if isinstance(event, Started):
            if self.phase != "new":
                raise ValueError(f"Started in phase {self.phase}: a launch starts once")
            return self._stop_at_boundary(event.steps, (), now)
        if isinstance(event, Paused):
            if self.phase == "new":
                raise ValueError("Paused before Started: a fresh launch reports Started")
            if self.phase == "recovering":
                self.lost.update(event.lost)
                return []
            if self.phase == "running":  # a recovery begins here: the next round
                self.round, self.holdings, self.decided = Round(self.round.epoch + 1, self.round.view), {}, {}
            return self._stop_at_boundary(event.steps, event.lost, now)
        raise TypeError(f"unknown event {event!r}")

    # ---- phases -----------------------------------------------------------------------------------------------
    def _stop_at_boundary(self, steps: tuple[int, ...], lost: tuple[str, ...], now: float) -> list[Action]:
        self.phase, self.steps, self.deadline = "recovering", tuple(sorted(set(steps))), now + self.timeout_s
        self.lost.update(c for c in lost if c in self.clusters and c != self.me)
        self.holdings[self.me] = self.steps
        return self._broadcast(Holdings(self.job, self.me, self.round, self.steps)) + self._check()

    def _adopt(self, target: Round, now: float) -> list[Action]:
        """Move to round `target` (newer than ours): what we gathered for the old round no longer counts."""
        if target == self.round:
            return []
        if target.view != self.round.view and self.phase == "recovering":
            self.deadline = now + self.timeout_s  # a cluster came back: the agreement gets its full time again
        self.round, self.holdings, self.decided = target, {}, {}
        if self.phase == "running":
            self.phase = "pausing"
            return [RequestPause(f"recovery round {target.epoch} began (a cluster was lost or launched again)")]
        if self.phase == "recovering":
            self.holdings[self.me] = self.steps
            return self._broadcast(Holdings(self.job, self.me, self.round, self.steps))
        return []  # new / pausing: our holdings go out when we stop at the boundary

    def _received(self, m: RecoveryMessage, now: float) -> list[Action]:
        if m.job != self.job or m.sender == self.me or m.sender not in self.clusters or \
                len(m.round.view) != len(self.clusters):
            return []
        j = self.clusters.index(m.sender)
        if m.round.view[j] < self.round.view[j]:
            return []  # from an older launch of the sender (its messages may still be in flight): stale
        actions: list[Action] = []
        known_of_me = m.round.view[self._i]
        if known_of_me > self.incarnation:
            if not self.fresh:
                self.phase = "over"
                return [Superseded(f"cluster {self.me} was launched again (incarnation {known_of_me.count}, this "
                                   f"process is {self.incarnation.count}): this older process stops")]
            # a fresh launch whose disk lost its count: it is the newest launch, numbered above the one seen
            self.incarnation = Incarnation(known_of_me.count + 1, self.incarnation.nonce)
            actions.append(Renumbered(self.incarnation))
        target = self.round.with_incarnation(self._i, self.incarnation).merge(m.round)
        actions += self._adopt(target, now)
        if m.round != self.round or self.phase in ("running", "over"):
            return actions  # an older round (after the merge), or copies of the round we resumed in
        if isinstance(m, Holdings):
            self.holdings.setdefault(m.sender, m.steps)  # one Holdings per launch and round: a copy changes nothing
        else:
            self.decided.setdefault(m.sender, m.step)
        return actions + self._check()

    def _check(self) -> list[Action]:
        if self.phase != "recovering":
            return []
        actions: list[Action] = []
        if self.me not in self.decided and len(self.holdings) == len(self.clusters):
            common = set.intersection(*(set(s) for s in self.holdings.values()))
            self.decided[self.me] = max(common) if common else -1
            actions += self._broadcast(Decided(self.job, self.me, self.round, self.decided[self.me]))
        if self.me in self.decided and len(self.decided) == len(self.clusters):
            mine = self.decided[self.me]
            other = next((c for c, s in self.decided.items() if s != mine), None)
            if other is not None:  # same holdings, another answer: that cluster does not follow the protocol
                self.phase = "over"
                return actions + [GiveUp(other, f"cluster {other} decided step {self.decided[other]} in recovery "
                                                f"round {self.round.epoch} where the holdings give {mine}: it runs "
                                                f"another version or is faulty; {RESTART_HINT}")]
            self.phase, self.fresh, self.deadline = "running", False, None
            self.lost.clear()
            actions.append(Resume(mine, self.round))
        return actions

    def _tick(self, now: float) -> list[Action]:
        if self.phase != "recovering" or self.deadline is None or now < self.deadline:
            return []
        self.phase = "over"
        waiting = self.holdings if len(self.holdings) < len(self.clusters) else self.decided
        missing = [c for c in self.clusters if c not in waiting]
        first = next((c for c in missing if c in self.lost), missing[0] if missing else self.me)
        what = "holdings" if waiting is self.holdings else "decision"
        return [GiveUp(first, f"peer cluster {first} did not come back within recovery_timeout_s="
                              f"{self.timeout_s:g} s (no {what} from {', '.join(missing)} in recovery round "
                              f"{self.round.epoch}); {RESTART_HINT}")]

    def _broadcast(self, m: RecoveryMessage) -> list[Action]:
        return [Send(c, m) for c in self.clusters if c != self.me]

    @property
    def missing(self) -> list[str]:
        """Clusters whose holdings (or, once all holdings are in, whose decision) this round still lacks."""
        waiting = self.holdings if len(self.holdings) < len(self.clusters) else self.decided
        return [c for c in self.clusters if c not in waiting]
