"""A simulated job for the recovery agreement: each cluster's state machine, the messages in flight between them
(per pair in order, as a channel delivers them, or in any order with copies), launches, kills and pauses. Messages
sent to a cluster that was killed wait for its next launch, as the switches keep them."""
from __future__ import annotations

import copy
import random
from dataclasses import dataclass, field

from nebula.recovery.messages import Incarnation, RecoveryMessage
from nebula.recovery.protocol import (Agreement, GiveUp, Paused, Received, Renumbered, RequestPause, Resume, Send,
                                      Started, Superseded, Tick)

JOB = "job"


@dataclass
class Sim:
    clusters: tuple[str, ...]
    timeout_s: float = 60.0
    nodes: dict[str, Agreement] = field(default_factory=dict)
    queues: dict[tuple[str, str], list[RecoveryMessage]] = field(default_factory=dict)  # (from, to) -> in order
    pause_wanted: set[str] = field(default_factory=set)
    disks: dict[str, int] = field(default_factory=dict)  # launches per cluster, as its disk keeps them
    holdings: dict[str, tuple[int, ...]] = field(default_factory=dict)  # each cluster's checkpoints on disk
    resumes: list[tuple[str, Incarnation, int, object]] = field(default_factory=list)  # (cluster, inc, step, round)
    other: list[tuple[str, object]] = field(default_factory=list)  # GiveUp, Superseded, Renumbered
    now: float = 0.0
    nonce: int = 1000

    def launch(self, c: str, steps: tuple[int, ...], count: int | None = None) -> None:
        self.disks[c] = self.disks.get(c, 0) + 1 if count is None else count
        self.nonce += 7
        self.nodes[c] = Agreement(JOB, self.clusters, c, Incarnation(self.disks[c], self.nonce), self.timeout_s)
        self.holdings[c] = steps
        self._route(c, self.nodes[c].handle(Started(steps), self.now))

    def kill(self, c: str) -> None:
        """Every rank of `c` dies: its messages already sent stay in flight; it asks for no pause any more."""
        del self.nodes[c]
        self.pause_wanted.discard(c)

    def pause(self, c: str, lost: tuple[str, ...] = ()) -> None:
        """The runtime of `c` stops at its boundary (after losing `lost`, or as it was asked)."""
        self.pause_wanted.discard(c)
        self._route(c, self.nodes[c].handle(Paused(self.holdings[c], lost), self.now))

    def tick(self, dt: float) -> list:
        self.now += dt
        out = []
        for c, node in list(self.nodes.items()):
            acts = node.handle(Tick(), self.now)
            out += acts
            self._route(c, acts)
        return out

    def _route(self, c: str, actions: list) -> None:
        for a in actions:
            if isinstance(a, Send):
                self.queues.setdefault((c, a.to), []).append(a.message)
            elif isinstance(a, RequestPause):
                self.pause_wanted.add(c)
            elif isinstance(a, Resume):
                self.resumes.append((c, self.nodes[c].incarnation, a.step, a.round))
            elif isinstance(a, Renumbered):
                self.disks[c] = a.incarnation.count
                self.other.append((c, a))
            elif isinstance(a, (GiveUp, Superseded)):
                self.other.append((c, a))

    # ---- choices ------------------------------------------------------------------------------------------------
    def choices(self) -> list[tuple]:
        """What can happen next: a message delivered (the first of a pair's queue), or a wanted pause taken."""
        out: list[tuple] = [("deliver", pair) for pair, q in sorted(self.queues.items()) if q and pair[1] in self.nodes]
        return out + [("pause", c) for c in sorted(self.pause_wanted)]

    def do(self, choice: tuple, *, any_order: bool = False, rng: random.Random | None = None,
           copies: float = 0.0) -> None:
        kind, what = choice
        if kind == "pause":
            self.pause(what)
            return
        q = self.queues[what]
        i = rng.randrange(len(q)) if any_order and rng else 0
        msg = q[i] if rng and rng.random() < copies else q.pop(i)  # a copy stays behind: delivered twice
        self._route(what[1], self.nodes[what[1]].handle(Received(msg), self.now))

    def run_random(self, rng: random.Random, *, any_order: bool = True, copies: float = 0.2,
                   limit: int = 10_000, until=None) -> None:
        for _ in range(limit):
            if until is not None and until(self):
                return
            options = self.choices()
            if not options:
                return
            self.do(rng.choice(options), any_order=any_order, rng=rng, copies=copies)
        raise AssertionError("the simulation did not settle")

    def clone(self) -> Sim:
        """A copy to explore another order from (messages and rounds are immutable: shared)."""
        out = copy.copy(self)
        out.nodes = {}
        for c, n in self.nodes.items():
            m = copy.copy(n)
            m.holdings, m.decided, m.lost = dict(n.holdings), dict(n.decided), set(n.lost)
            out.nodes[c] = m
        out.queues = {k: list(q) for k, q in self.queues.items()}
        out.pause_wanted, out.disks, out.holdings = set(self.pause_wanted), dict(self.disks), dict(self.holdings)
        out.resumes, out.other = list(self.resumes), list(self.other)
        return out

    def key(self) -> tuple:
        nodes = tuple((c, n.phase, n.round, n.incarnation, tuple(sorted(n.holdings.items())),
                       tuple(sorted(n.decided.items()))) for c, n in sorted(self.nodes.items()))
        return nodes, tuple((p, tuple(q)) for p, q in sorted(self.queues.items())), tuple(sorted(self.pause_wanted))

    # ---- outcome ------------------------------------------------------------------------------------------------
    def final(self) -> dict[str, tuple[int, object]]:
        """Each live cluster's last resume: (step, round)."""
        out = {}
        for c, inc, step, rnd in self.resumes:
            if c in self.nodes and self.nodes[c].incarnation == inc:
                out[c] = (step, rnd)
        return out

    def check_safety(self) -> None:
        """Every cluster that resumed in a round resumed from the same step as every other one in that round."""
        by_round: dict[object, set[int]] = {}
        for _, _, step, rnd in self.resumes:
            by_round.setdefault(rnd, set()).add(step)
        assert all(len(s) == 1 for s in by_round.values()), by_round


def explore(sim: Sim, settle, limit: int = 200_000) -> int:
    """Every order of events from `sim` (channels in order per pair); `settle(sim)` checks each end state.
    Returns how many distinct states were reached."""
    seen, stack = set(), [sim]
    while stack:
        s = stack.pop()
        k = s.key()
        if k in seen:
            continue
        seen.add(k)
        assert len(seen) < limit, "too many states"
        options = s.choices()
        if not options:
            settle(s)
            continue
        for choice in options:
            nxt = s.clone()
            nxt.do(choice)
            stack.append(nxt)
    return len(seen)
