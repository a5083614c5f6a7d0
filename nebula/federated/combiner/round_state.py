"""One synchronous round at a combiner as pure state: which clients were asked, who answered, what was accepted,
refused or folded, and the partial it reports. No sockets: `nebula.federated.combiner.rounds.SyncRound` does the
I/O around it (fan-out, pulls, pieces, audit), and a test can drive it with messages it builds itself. The controller's
side of a round is pure state the same way (`nebula.federated.controller.reduction.Reduction`).

A refused update is one of two kinds: an asked client's first answer for this round, recorded one by one (it
stops the wait for that client), or something a sender can repeat at will (late, uninvited, duplicate), counted.
"""
from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from nebula.mean import RunningMean, Weights
from nebula.federated.checks import Refusal, check_update_header
from nebula.federated.messages import ClientUpdate, Partial
from nebula.federated.strategy import Strategy
from nebula.messaging import Malformed, Peer, manifest

__all__ = ["RoundState"]


class RoundState:
    """Round `round` from model `version` (whose `weights` give the layout), asked of `asked`."""

    def __init__(self, *, job: str, round: int, version: int, asked: Iterable[Peer], weights: Weights,
                 strategy: Strategy, max_examples: int, unit_weight: bool = False) -> None:
        self.job, self.round, self.version = job, round, version
        self.asked = list(asked)
        self.expected = {str(p) for p in self.asked}
        self.tensors = manifest(weights)
        self.strategy, self.max_examples = strategy, max_examples
        self.seen: set[str] = set()  # asked clients that answered (accepted or refused)
        self.rejected: list[dict] = []  # the asked clients' refused answers (one each at most)
        self.accepted: list[str] = []
        self.rejoined: set[Peer] = set()  # clients that said hello again during the round (restarted)
        self.mean = RunningMean(weights) if strategy.streaming else None
        self.kept: list[tuple[Weights, int]] = []  # non-streaming strategies keep every update
        self.names: list[str] = []
        self.metrics: dict[str, float] = {}  # eval metrics, weighted by eval examples
        self.eval_examples = 0
        self.update_bytes = 0  # what the accepted updates' pieces took on the wire
        self.norm_max = 0.0  # the largest change among the accepted updates (to choose max_update_norm by)
        # differential privacy: every update weighs the same (the mean's denominator is the number of updates)
        self.unit_weight = unit_weight
        self.examples = 0  # what the folded updates claim to hold

    def waiting(self) -> bool:
        """Whether an asked client has not answered yet."""
        return bool(self.expected - self.seen)

    def missing(self) -> list[Peer]:
        """The asked clients that never answered."""
        return [p for p in self.asked if str(p) not in self.seen]

    def check(self, who: str, upd: ClientUpdate | Malformed, *, known_version: int, grant: str | None = None
              ) -> Refusal | None:
        """Why this update must be refused (the cluster's grant first, then its header), or None."""
        if grant is not None:
            return Refusal("grant", grant)
        if isinstance(upd, Malformed):
            return Refusal("malformed", upd.reason)
        return check_update_header(upd, job=self.job, round=self.round, version=self.version,
                                   known_version=known_version, expected=self.expected, seen=self.seen, who=who,
                                   tensors=self.tensors, max_examples=self.max_examples)

    def refuse(self, who: str, upd: ClientUpdate | Malformed, why: Refusal) -> bool:
        """Note a refused header; True when it is the asked client's first answer (recorded), False when it is to
        be counted."""
        claimed = upd.head.get("round") if isinstance(upd, Malformed) else upd.round
        first = claimed == self.round and who in self.expected and who not in self.seen
        if first:
            self.seen.add(who)  # a bad update for this round is this client's answer: stop waiting for it
            self.rejected.append({"client": who, "reason": str(why)})
        return first

    def accept(self, who: str) -> None:
        """The header passed: the client has answered; its pieces come next."""
        self.seen.add(who)
        self.accepted.append(who)

    def reject(self, who: str, reason: str) -> None:
        """An accepted update whose pieces failed (incomplete, malformed, non-finite, too large a change)."""
        self.accepted.remove(who)
        self.rejected.append({"client": who, "reason": reason})

    def fold(self, who: str, upd: ClientUpdate, pieces: Iterable[tuple[str, int, np.ndarray]], *, nbytes: int,
             norm: float | None) -> None:
        """Fold a checked update (its pieces: tensor, element offset, values) into the round's partial."""
        self.update_bytes += nbytes
        self.norm_max = max(self.norm_max, norm or 0.0)
        n = int(upd.num_examples)
        self.examples += n
        n = 1 if self.unit_weight else n
        if self.mean is not None:  # checked whole, folded piece by piece
            self.mean.begin(n, who)
            for k, off, v in pieces:
                self.mean.add_part(k, v, off)
        else:
            w = {k: np.empty(s, d) for k, d, s in ((t[0], np.dtype(t[1]), tuple(t[2])) for t in self.tensors)}
            for k, off, v in pieces:
                w[k].reshape(-1)[off : off + v.size] = v
            self.kept.append((w, n))
            self.names.append(who)
        self._eval_metrics(upd.metrics)

    def _eval_metrics(self, m: Any) -> None:
        """The client's evaluation of the round's model, weighted by its eval examples (bounded like its count)."""
        m = m if isinstance(m, dict) else {}
        ne = m.get("eval_examples", 0)
        ne = ne if isinstance(ne, int) and not isinstance(ne, bool) and 0 < ne <= self.max_examples else 0
        for k in ("eval_loss", "accuracy"):
            v = m.get(k)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v) and ne > 0:
                self.metrics[k] = self.metrics.get(k, 0.0) + float(v) * ne
        self.eval_examples += ne

    def partial(self, *, run: str | None, counted: list[dict], checkpoint: str | None, delta: bool
                ) -> tuple[Partial, Weights | None]:
        """The round's report to the controller and the partial model (None without updates); `counted` are the
        refusals counted since the last round."""
        if self.mean is not None:
            num_updates = self.mean.num_updates
            weights = self.mean.mean if num_updates else None
        else:
            num_updates = len(self.kept)
            weights = self.strategy.combine(self.kept, self.names) if self.kept else None
        metrics = {k: v / self.eval_examples for k, v in self.metrics.items()} if self.eval_examples else {}
        msg = Partial(run=run, round=self.round, version=self.version, num_updates=num_updates,
                      num_examples=self.examples, clients=tuple(sorted(self.accepted)),
                      rejected=tuple(self.rejected + counted), missing=tuple(str(p) for p in self.missing()),
                      metrics=metrics, eval_examples=self.eval_examples, update_bytes=self.update_bytes,
                      update_norm_max=self.norm_max, delta=delta, checkpoint=checkpoint,
                      weight=num_updates if self.unit_weight and num_updates else None)
        return msg, weights
