"""The controller's part of differential privacy (`RoundPrivacy`): the accountant over the rounds, the budget a
job's `target_epsilon` sets, the sampling of each round's clients, and the central noise on the released mean. A job
without it gets `controller.capabilities.NoRoundPrivacy`, which has the same methods (the round calls them whatever
the job says).

Sampling (`differential_privacy.sampler`), from the OS's randomness (never the job's seed: amplification by
sampling holds only if nobody can predict the sample), over the job's whole population of clients, not only those
connected (a client that is drawn but not connected takes no part, which lowers no one's privacy):
  poisson   each client independently with probability q = clients_per_round / population, as
            `PoissonSampledDpEvent` assumes. A round may draw nobody: it is skipped (recorded, no model) and still
            counted, since the draw was made and its outcome is part of what the accountant analyses.
  fixed     exactly clients_per_round of the population, uniformly without replacement, accounted by
            `SampledWithoutReplacementDpEvent` with replace-one adjacency (sensitivity 2C).
The sampler run and the number drawn are in every round's record (`privacy.sampler`, `privacy.sampled`).

Which rounds are counted: every round run, whatever came of it (a sample was drawn; a sum, if any, was computed
and, under central DP, seen by its combiner). Each draw is recorded in the trail before the round's clients hear of
it, so a restarted controller counts every draw made, including that of a round its predecessor died in (and a
round run again after such a crash counts twice: both draws reached an aggregator); rounds recorded before draws
were (older trails) count once each, a stopped round (never run) not at all.

The released mean under central DP is (Σ clipped changes + N(0, (zC)²)) / clients_per_round: the expected count,
not the count that took part, which would tell who was drawn (McMahan et al. 2018's fixed denominator); local and
distributed DP divide by the count, which their adversary, the aggregator, sees anyway.
"""
from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from nebula.federated.actor_channels import FIRST_CLIENT_RANK
from nebula.federated.config import FederatedJob
from nebula.federated.controller.trail import ModelTrail
from nebula.federated.privacy import noise_rng, server_noise_std
from nebula.mean import Weights
from nebula.messaging import Peer

if TYPE_CHECKING:
    from nebula.federated.controller.reduction import Reduction
    from nebula.federated.privacy.accountant import BudgetStatus

__all__ = ["RoundPrivacy", "STOPPED", "poisson_sample", "fixed_sample"]

STOPPED = "stopped"  # the status of a round that was never run (the budget forbade it, or no combiner could
# advance the model under secure aggregation): never counted


def poisson_sample(population: Sequence[Peer], q: float, draw: Callable[[], float]) -> list[Peer]:
    """Each of `population` independently with probability `q` (`draw`: uniform in [0, 1))."""
    return sorted(p for p in population if draw() < q)


def fixed_sample(population: Sequence[Peer], m: int, rng: random.Random) -> list[Peer]:
    """Exactly `m` of `population`, uniformly without replacement."""
    return sorted(rng.sample(list(population), m))


class RoundPrivacy:
    """Differential privacy of `job` (its `differential_privacy` section), resumed from `trail`; `rng`: where the
    sample is drawn from (the OS's randomness; a test may pass its own)."""

    def __init__(self, job: FederatedJob, trail: ModelTrail, rng: random.Random | None = None) -> None:
        from nebula.federated.privacy.accountant import accountant_for  # a second to import

        self.dp = dp = job.differential_privacy
        self.clients = [Peer(c.id, FIRST_CLIENT_RANK + i) for c in job.clusters for i in range(c.num_clients)]
        self.population = len(self.clients)
        self.per_round = min(job.clients_per_round or self.population, self.population)
        self.trail = trail
        draws = trail.draws()
        spent = len(draws) + sum(1 for r in trail.rounds() if r.status != STOPPED and r.round not in set(draws))
        self.accountant = accountant_for(dp.mode, dp.sampler, dp.noise_multiplier, self.per_round, self.population,
                                         dp.delta, dp.accountant, spent)
        self.sampling_rate = self.accountant.sampling_rate
        self.rng: np.random.Generator = noise_rng()
        self.draw_rng = rng or random.SystemRandom()
        self.sampled: int | None = None  # how many the last draw took (None: no draw yet)

    def budget(self) -> BudgetStatus:
        """Whether one more round stays within the job's target_epsilon."""
        return self.accountant.budget(self.dp.target_epsilon)

    def exhausted(self) -> str | None:
        """Why the job's target_epsilon forbids one more round, or None."""
        budget = self.budget()
        return None if budget.may_continue else budget.reason

    def noise_std(self) -> float:
        """Std of the noise the reducer adds to the sum (central DP), 0 otherwise."""
        return server_noise_std(self.dp)

    def spend(self) -> dict[str, Any]:
        """Count one more round run; where the budget stands now."""
        self.accountant.step()
        return self.describe()

    def metrics(self, spent: dict[str, Any]) -> dict[str, float]:
        """What a round's metrics keep of where the budget stands after it (`spent`, as `spend` said)."""
        return {"epsilon": spent["epsilon"], "delta": spent["delta"]}

    def invalid(self, red: Reduction) -> str | None:
        """Why the round does not count: the reduction's reason, or, when the sampler drew nobody, that."""
        why = red.invalid()
        if why is not None and self.sampled == 0:
            return "the sampler drew no client: the round is skipped (the accountant counts it, the draw was made)"
        return why

    def detail(self, spent: dict[str, Any] | None = None) -> dict[str, Any]:
        """What a round's record (`spent`: where this round's `spend` left the budget) and the status file keep of
        differential privacy."""
        return {"privacy": spent or self.describe()}

    def describe(self) -> dict[str, Any]:
        """For the trail and the status file: ε at δ spent so far, what it was computed from, and the sampler run
        (with how many its last draw took)."""
        return {**self.accountant.describe(), "mode": self.dp.mode, "sampler": self.dp.sampler,
                "sampled": self.sampled, "clients_per_round": self.per_round, "clip_norm": self.dp.clip_norm,
                "target_epsilon": self.dp.target_epsilon}

    def sample(self, connected: Sequence[Peer], round: int) -> list[Peer]:
        """Round `round`'s clients: the job's sampler run over the whole population, the draw recorded in the trail
        (durably, before anyone hears of it), then those of them connected."""
        if self.dp.sampler == "poisson":
            drawn = poisson_sample(self.clients, self.per_round / self.population, self.draw_rng.random)
        else:
            drawn = fixed_sample(self.clients, self.per_round, self.draw_rng)
        self.sampled = len(drawn)
        self.trail.record_draw(round, self.dp.sampler, self.sampled)
        here = set(connected)
        return [p for p in drawn if p in here]

    def release(self, red: Reduction) -> Weights:
        """The round's released mean as weights. Central DP: the model plus (the sum of the clipped changes +
        N(0, (zC)²) on every value) / clients_per_round; otherwise the reduction's own mean."""
        if self.dp.mode != "central":
            return red.result()
        mean, n, std = red.mean.result(), red.weight, self.noise_std()
        out = {}
        for k, base in red.weights.items():
            change = np.asarray(mean[k], np.float64) - (0.0 if red.coded else base)
            noisy_sum = change * n + self.rng.normal(0.0, std, np.shape(base))
            out[k] = (base + noisy_sum / self.per_round).astype(base.dtype)
        return out
