"""One synchronous round at the controller as pure state: the combiners' partials folded into the reducer's mean, what
they reported (clients, refusals, metrics), and whether the round counts. No sockets: `Controller._round` does the
I/O around it (the model out, partials and their pieces in, the trail and the audit log)."""
from __future__ import annotations

from typing import Any

from nebula.mean import RunningMean, Weights
from nebula.federated.config import ValiditySpec
from nebula.federated.messages import Partial

__all__ = ["Reduction"]


class Reduction:
    """The round's reduce from model `weights`: `coded` when the combiners average the clients' changes (an update
    codec) rather than their weights; `expected_examples`: what the asked clients hold; `max_weight`: secure
    aggregation's cap W on a client's public weight, which bounds a secure partial's weight to [n, n·W] for its n
    clients (so no combiner can claim a weight that silences the others)."""

    def __init__(self, weights: Weights, *, coded: bool, update_codec: str, validity: ValiditySpec,
                 expected_examples: int, max_weight: int | None = None) -> None:
        self.weights, self.coded, self.update_codec = weights, coded, update_codec
        self.max_weight = max_weight
        self.revealed: list = []  # secure aggregation: the combiners whose partial carried a sum (it was revealed)
        self.validity, self.expected_examples = validity, expected_examples
        self.mean = RunningMean(weights)
        self.num_updates, self.update_bytes, self.norm_max, self.eval_examples = 0, 0, 0.0, 0
        self.clients: list[str] = []
        self.rejected: list[dict[str, Any]] = []
        self.missing: list[str] = []
        self.lost: list[str] = []  # combiners whose partial never came or broke off
        self.metric_sums: dict[str, float] = {}
        self.broken = False  # a half-folded partial cannot be taken out again: the round is invalid
        self.examples = 0  # what the folded partials' clients hold (their weights may differ: see `weight`)
        self.dropped: list[str] = []  # secure aggregation: clients whose masks were removed after they dropped
        self.protocol_bytes = [0, 0]  # secure aggregation: its stage messages at every combiner, from and to clients
        self._bounds = 0.0  # Σ weight · error bound of the partials

    def refusal(self, p: Partial, asked: int) -> str | None:
        """Why a partial cannot be folded (it averages what the job does not, or more clients than its combiner
        was asked: `asked`), or None."""
        if isinstance(p.num_updates, bool) or not isinstance(p.num_updates, int) or not 0 <= p.num_updates <= asked:
            return f"partial claims {p.num_updates!r} updates, its combiner was asked {asked} clients"
        if p.delta != self.coded:
            return (f"partial is {'a change' if p.delta else 'weights'}, the job's update_codec="
                    f"{self.update_codec!r} makes it {'a change' if self.coded else 'weights'}")
        if self.max_weight is not None and p.num_updates:
            w, n = p.weight, p.num_updates
            if isinstance(w, bool) or not isinstance(w, int) or not n <= w <= n * self.max_weight:
                return (f"secure partial of {n} clients has weight {w!r}, outside [{n}, {n * self.max_weight}]: each "
                        f"client's public weight is 1..secure_aggregation.max_weight={self.max_weight}")
        return None

    def begin(self, p: Partial, who: str) -> None:
        """Its pieces come next (each to `self.mean.add_part`)."""
        if p.num_updates:
            self.mean.begin(p.num_examples if p.weight is None else p.weight, who)

    def lose(self, combiner: str, broken: bool = False, clients: list[str] | None = None) -> None:
        """A combiner's partial did not come (its `clients` are missing) or broke off mid-transfer (`broken`)."""
        self.lost.append(combiner)
        self.missing += clients or []
        self.broken = self.broken or broken

    def take(self, p: Partial) -> None:
        """A partial folded whole: its counts, clients, refusals and evaluation metrics."""
        self.num_updates += p.num_updates
        self.update_bytes += p.update_bytes
        self.norm_max = max(self.norm_max, p.update_norm_max)
        self.clients += p.clients
        self.rejected += p.rejected
        self.missing += p.missing
        for k, v in p.metrics.items():
            self.metric_sums[k] = self.metric_sums.get(k, 0.0) + float(v) * p.eval_examples
        self.eval_examples += p.eval_examples
        self.examples += p.num_examples
        self.dropped += p.dropped
        self.protocol_bytes = [a + b for a, b in zip(self.protocol_bytes, p.protocol_bytes)]
        if p.num_updates:
            self._bounds += p.error_bound * (p.num_examples if p.weight is None else p.weight)

    @property
    def num_examples(self) -> int:
        return self.examples

    @property
    def weight(self) -> int:
        """The total weight of the mean: the examples, the secure sums' counts, or (under differential privacy)
        the number of updates."""
        return self.mean.num_examples

    @property
    def error_bound(self) -> float:
        """Secure aggregation: the bound on each value of the mean from the combiners' fixed-point rounding."""
        return self._bounds / self.weight if self.weight else 0.0

    def metrics(self) -> dict[str, float]:
        """The clients' evaluation of the round's model (the parent of the next), weighted by eval examples."""
        if not self.eval_examples:
            return {}
        return {f"parent_{k}": v / self.eval_examples for k, v in self.metric_sums.items()}

    def invalid(self) -> str | None:
        """Why the round does not count (a broken partial, too few updates or examples), or None."""
        if self.broken:
            return "a partial model broke off mid-transfer"
        v = self.validity
        if self.num_updates < v.min_updates:
            return f"{self.num_updates} updates < validity.min_updates={v.min_updates}"
        if self.expected_examples and self.num_examples < v.min_fraction_examples * self.expected_examples:
            return (f"{self.num_examples} examples < validity.min_fraction_examples={v.min_fraction_examples} of "
                    f"{self.expected_examples} expected")
        return None

    def result(self) -> Weights:
        """The weighted mean of the partials, as weights (a coded round's mean change added to the model); central
        differential privacy's noisy release is `controller.privacy.RoundPrivacy.release`'s."""
        mean = self.mean.result()
        return {k: self.weights[k] + mean[k] for k in self.weights} if self.coded else mean
