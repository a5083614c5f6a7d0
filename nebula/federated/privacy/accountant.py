"""Privacy accounting with Google's `dp-accounting`: ε at the job's δ after every round, and the budget check.

Each round is one Gaussian mechanism with noise multiplier z on the sum of clipped changes (sensitivity C), behind
the sampler the controller ran, each accounted by the analysis that holds for it:
  poisson   each client takes part independently with probability q = clients_per_round / population:
            `PoissonSampledDpEvent(q, GaussianDpEvent(z))`, add/remove adjacency (a client in or out moves the sum
            by C).
  fixed     exactly m = clients_per_round of the population's N clients, uniformly without replacement:
            `SampledWithoutReplacementDpEvent(N, m, GaussianDpEvent(z/2))` with the RDP accountant's replace-one
            relation, the only adjacency that analysis holds for (N is public, one client's data replaced by
            another's moves the sum by 2C: sensitivity doubled, noise multiplier halved). dp-accounting's PLD
            accountant has no analysis of it.
  none      no amplification: local and distributed DP, whose adversary (the aggregator) saw who sent, and so
            replace-one adjacency: `GaussianDpEvent(z/2)`.
Amplification by sampling holds only against someone who does not see who took part, and only if nobody can
predict the sample (the controller draws it from the OS's randomness). `rdp` (Rényi DP, Mironov 2017) is the
classic upper bound; `pld` (privacy loss distributions) is tighter.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import dp_accounting
from dp_accounting import pld, rdp

# the RDP accountant logs a warning for each order whose series does not converge at small noise (and leaves it
# out, which only loosens nothing: epsilon is the minimum over the orders kept); a controller would log dozens a round
logging.getLogger("absl").setLevel(logging.ERROR)

__all__ = ["PrivacyAccountant", "BudgetStatus", "sampling_rate_for", "accountant_for", "noise_for_epsilon",
           "ACCOUNTED_SAMPLERS"]

ACCOUNTED_SAMPLERS = ("poisson", "fixed", "none")


def sampling_rate_for(mode: str, clients_per_round: int, population: int) -> float:
    """The sampling rate to account with: clients_per_round/population centrally, 1 where the adversary saw who."""
    if population < 1 or not 1 <= clients_per_round <= population:
        raise ValueError(f"clients_per_round={clients_per_round} must be between 1 and the population {population}")
    return clients_per_round / population if mode == "central" else 1.0


def accountant_for(mode: str, sampler: str, noise_multiplier: float, clients_per_round: int, population: int,
                   delta: float, kind: str = "rdp", rounds: int = 0) -> PrivacyAccountant:
    """The accountant of a job's rounds: its DP `mode` and the `sampler` its controller runs (module docstring)."""
    q = sampling_rate_for(mode, clients_per_round, population)
    accounted = sampler if mode == "central" else "none"
    return PrivacyAccountant(noise_multiplier, q, delta, kind, rounds, sampler=accounted, population=population)


@dataclass(frozen=True, slots=True)
class BudgetStatus:
    """Where the budget stands: ε spent, ε after one more round, and whether that round may run."""

    rounds: int
    epsilon: float
    next_epsilon: float
    target_epsilon: float | None
    may_continue: bool
    reason: str | None  # one line for the model trail and the audit log when the budget is spent


class PrivacyAccountant:
    """ε(δ) of `rounds` sampled Gaussian rounds; `step()` after each round that was run.

    `sampler` poisson (the default: rate `sampling_rate`, add/remove), fixed (`sampling_rate` x `population`
    clients without replacement, replace-one) or none (every round a plain Gaussian, replace-one)."""

    def __init__(self, noise_multiplier: float, sampling_rate: float, delta: float, kind: str = "rdp",
                 rounds: int = 0, *, sampler: str = "poisson", population: int | None = None) -> None:
        if not noise_multiplier > 0:
            raise ValueError(f"noise_multiplier={noise_multiplier} must be > 0 for a finite epsilon")
        if not 0 < sampling_rate <= 1:
            raise ValueError(f"sampling rate {sampling_rate} must be in (0, 1]")
        if not 0 < delta < 1:
            raise ValueError(f"delta={delta} must be in (0, 1)")
        if kind not in ("rdp", "pld"):
            raise ValueError(f"accountant {kind!r} is not rdp or pld")
        if rounds < 0:
            raise ValueError(f"rounds={rounds} must be >= 0")
        if sampler not in ACCOUNTED_SAMPLERS:
            raise ValueError(f"sampler {sampler!r} is not one of {', '.join(ACCOUNTED_SAMPLERS)}")
        self.sample_size = 0
        if sampler == "fixed":
            if population is None or population < 1:
                raise ValueError("sampler fixed needs the population the sample is drawn from")
            self.sample_size = round(sampling_rate * population)
            if not 1 <= self.sample_size <= population or not math.isclose(self.sample_size, sampling_rate *
                                                                            population, rel_tol=1e-9):
                raise ValueError(f"sampling rate {sampling_rate} of {population} is not a whole sample")
            if kind == "pld" and self.sample_size < population:
                raise ValueError("dp-accounting's PLD accountant has no analysis of sampling without replacement; "
                                 "use the rdp accountant or Poisson sampling")
        self.noise_multiplier, self.sampling_rate, self.delta = float(noise_multiplier), float(sampling_rate), delta
        self.kind, self.rounds, self.sampler, self.population = kind, int(rounds), sampler, population
        # replace-one adjacency (a fixed sample, or an adversary who saw who sent) doubles the sensitivity
        self.adjacency = "add/remove" if sampler == "poisson" else "replace-one"
        self._memo: dict[int, float] = {0: 0.0}  # rounds -> ε: each query costs 0.1 s (RDP) to 0.8 s (PLD)

    def event(self) -> dp_accounting.DpEvent:
        """One round as a DpEvent."""
        if self.sampler == "poisson":
            g = dp_accounting.GaussianDpEvent(self.noise_multiplier)
            return g if self.sampling_rate == 1 else dp_accounting.PoissonSampledDpEvent(self.sampling_rate, g)
        g = dp_accounting.GaussianDpEvent(self.noise_multiplier / 2)  # sensitivity 2C
        if self.sampler == "fixed" and self.sample_size < self.population:
            return dp_accounting.SampledWithoutReplacementDpEvent(self.population, self.sample_size, g)
        return g

    def _fresh(self) -> dp_accounting.PrivacyAccountant:
        """An empty accountant of this kind, with the adjacency the event's analysis holds for."""
        if self.kind == "pld":
            return pld.PLDAccountant()
        if isinstance(self.event(), dp_accounting.SampledWithoutReplacementDpEvent):
            return rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
        return rdp.RdpAccountant()

    def epsilon_after(self, rounds: int) -> float:
        """ε at δ after `rounds` rounds (0 for none)."""
        rounds = max(0, rounds)
        if rounds not in self._memo:
            acc = self._fresh()
            acc.compose(self.event(), rounds)
            self._memo[rounds] = float(acc.get_epsilon(self.delta))
        return self._memo[rounds]

    def epsilon(self) -> float:
        """ε at δ spent so far."""
        return self.epsilon_after(self.rounds)

    def step(self, rounds: int = 1) -> float:
        """Count `rounds` more rounds run (a sample was drawn, whatever came of it); the ε now spent."""
        self.rounds += rounds
        return self.epsilon()

    def budget(self, target_epsilon: float | None) -> BudgetStatus:
        """Whether one more round stays within `target_epsilon` (None: no target, always yes)."""
        eps, nxt = self.epsilon(), self.epsilon_after(self.rounds + 1)
        if target_epsilon is None or nxt <= target_epsilon:
            return BudgetStatus(self.rounds, eps, nxt, target_epsilon, True, None)
        return BudgetStatus(self.rounds, eps, nxt, target_epsilon, False,
                            f"privacy budget spent: epsilon {eps:.3f} after {self.rounds} rounds, round "
                            f"{self.rounds + 1} would reach {nxt:.3f} > target_epsilon {target_epsilon:g} at delta "
                            f"{self.delta:g}; the job stops here (raise target_epsilon or noise_multiplier to go on)")

    def max_rounds(self, target_epsilon: float, limit: int = 100_000) -> int:
        """The most rounds whose ε stays within `target_epsilon` (binary search, ε grows with rounds)."""
        if self.epsilon_after(1) > target_epsilon:
            return 0
        lo, hi = 1, 2
        while hi <= limit and self.epsilon_after(hi) <= target_epsilon:
            lo, hi = hi, hi * 2
        hi = min(hi, limit + 1)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if self.epsilon_after(mid) <= target_epsilon else (lo, mid)
        return lo

    def describe(self) -> dict:
        """For the model trail: the accountant's parameters and ε now."""
        eps = self.epsilon()
        return {"accountant": self.kind, "noise_multiplier": self.noise_multiplier, "sampling_rate":
                self.sampling_rate, "accounted_sampler": self.sampler, "adjacency": self.adjacency,
                "population": self.population, "delta": self.delta, "rounds": self.rounds,
                "epsilon": eps if math.isfinite(eps) else None}


def noise_for_epsilon(target_epsilon: float, rounds: int, sampling_rate: float, delta: float, kind: str = "rdp",
                      tolerance: float = 0.01, *, sampler: str = "poisson", population: int | None = None) -> float:
    """The smallest noise multiplier (to within `tolerance`, relative) whose ε at `delta` after `rounds` rounds
    stays within `target_epsilon`: what to write as `noise_multiplier` for a budget (bisection; ε falls as the
    noise grows)."""
    if not target_epsilon > 0 or rounds < 1:
        raise ValueError(f"target_epsilon={target_epsilon} must be > 0 and rounds={rounds} >= 1")

    def eps(z: float) -> float:
        return PrivacyAccountant(z, sampling_rate, delta, kind, rounds, sampler=sampler,
                                 population=population).epsilon()

    lo, hi = 0.05, 1.0
    while eps(hi) > target_epsilon:
        lo, hi = hi, hi * 2
        if hi > 1e4:
            raise ValueError(f"no noise multiplier up to 1e4 reaches epsilon {target_epsilon} in {rounds} rounds")
    while hi - lo > tolerance * hi:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if eps(mid) <= target_epsilon else (mid, hi)
    return hi
