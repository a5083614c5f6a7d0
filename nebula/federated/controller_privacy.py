"""The controller's part of differential privacy (`RoundPrivacy`): the accountant over the rounds, the budget a
job's `target_epsilon` sets, the central noise, and the sampling of each round's clients.

Which rounds are counted: every round in which any combiner summed updates (`num_updates` > 0), valid or not, since
a sum was computed and, under central DP, seen by its combiner; a restarted controller counts those of its trail.
Sampling: under central DP with `clients_per_round` below the population, each round's clients are drawn from the
OS's randomness (never the job's seed: amplification by sampling holds only if nobody can predict the sample), and
a round asks at most the accounted rate's share of the clients connected, so that no client takes part with a
higher probability than the accountant assumes.
"""
from __future__ import annotations

import math
import random
from typing import TYPE_CHECKING, Any

import numpy as np

from nebula.federated.config import FederatedJob
from nebula.federated.privacy import noise_rng, server_noise_std
from nebula.federated.trail import ModelTrail

if TYPE_CHECKING:
    from nebula.federated.privacy.accountant import BudgetStatus

__all__ = ["RoundPrivacy"]


class RoundPrivacy:
    """Differential privacy of `job` (its `differential_privacy` section), resumed from `trail`."""

    def __init__(self, job: FederatedJob, trail: ModelTrail) -> None:
        from nebula.federated.privacy.accountant import PrivacyAccountant, sampling_rate_for  # a second to import

        self.dp = dp = job.differential_privacy
        self.population = sum(c.num_clients for c in job.clusters)
        self.per_round = min(job.clients_per_round or self.population, self.population)
        self.sampling_rate = sampling_rate_for(dp.mode, self.per_round, self.population)
        spent = sum(1 for r in trail.rounds() if r.num_updates > 0)
        self.accountant = PrivacyAccountant(dp.noise_multiplier, self.sampling_rate, dp.delta, dp.accountant, spent)
        self.rng: np.random.Generator = noise_rng()

    def budget(self) -> BudgetStatus:
        """Whether one more round stays within the job's target_epsilon."""
        return self.accountant.budget(self.dp.target_epsilon)

    def noise_std(self) -> float:
        """Std of the noise the reducer adds to the sum (central DP), 0 otherwise."""
        return server_noise_std(self.dp)

    def spend(self) -> dict[str, Any]:
        """Count one more round whose sums were computed; where the budget stands now."""
        self.accountant.step()
        return self.describe()

    def describe(self) -> dict[str, Any]:
        """For the trail and the status file: ε at δ spent so far and what it was computed from."""
        return {**self.accountant.describe(), "mode": self.dp.mode, "clip_norm": self.dp.clip_norm,
                "target_epsilon": self.dp.target_epsilon}

    def sample(self, clients: list, k: int) -> list:
        """The round's clients out of those connected: `k` of them, and under sampled central DP at most the
        accounted rate of them, drawn with the OS's randomness."""
        if self.sampling_rate < 1:
            k = min(k, max(1, math.floor(self.sampling_rate * len(clients))))
        return sorted(random.SystemRandom().sample(clients, min(k, len(clients))))
