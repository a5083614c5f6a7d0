"""What a job's privacy settings make of the controller's rounds, chosen here once and nowhere else: secure
aggregation (`SecureRounds`; `PlainRounds` when off) and differential privacy (`controller.privacy.RoundPrivacy`;
`NoRoundPrivacy` when off). Each "off" is a no-op with the same methods, so `Controller._round` calls them whatever
the job says. They write no log line or audit record of their own (`RoundPrivacy` records each draw in the trail,
before anyone hears of it): the controller writes what they decide.

`secure_policy` and `privacy_policy` are the only places the controller reads the job's `secure_aggregation` and
`differential_privacy` sections.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Sequence

from nebula.federated.config import FederatedJob
from nebula.federated.controller.privacy import RoundPrivacy
from nebula.federated.secagg import UNMASK_STAGES, SecAggConfig
from nebula.messaging import Peer

if TYPE_CHECKING:
    from nebula.federated.controller.reduction import Reduction
    from nebula.federated.controller.trail import ModelTrail

__all__ = ["Admission", "PlainRounds", "SecureRounds", "NoRoundPrivacy", "secure_policy", "privacy_policy",
           "SEED_STRIDE"]

SEED_STRIDE = 100003  # without differential privacy round r's clients are drawn from the job's seed · this + r


@dataclass(frozen=True, slots=True)
class Admission:
    """Who may take part in a round: the combiners (`live`), a warning to log about those left out (`note`), and why
    the job must stop instead (`stop`: none is left that may advance the model), or None."""

    live: list[Peer]
    note: str | None = None
    stop: str | None = None


@dataclass(frozen=True, slots=True)
class PlainRounds:
    """Rounds without secure aggregation: every live combiner may take part; partials are means, no sums to unmask."""

    coded: ClassVar[bool] = False  # (a job's update_codec alone makes partials changes)
    max_weight: ClassVar[int | None] = None  # a plain partial's weight is its examples: no cap
    unmask_s: ClassVar[float] = 0.0  # no unmask stage to wait for after the deadline

    def admit(self, r: int, live: list[Peer], version: int) -> Admission:
        """Who of the `live` combiners may take part in round `r` on model `version`: all of them."""
        return Admission(live)

    def after_round(self, red: Reduction, why: str | None, version: int) -> None:
        """Round on model `version` ended (`why`: why it did not count, or None): nothing to remember."""

    def detail(self, red: Reduction) -> dict[str, Any]:
        """What the round's record keeps of secure aggregation: nothing."""
        return {}


@dataclass(frozen=True, slots=True)
class SecureRounds:
    """Rounds whose combiners report their clients' secure sums (the job's `secure_aggregation`: `config`).

    A combiner whose clients revealed a sum on a model in a round that did not count sits out further rounds on that
    model version (`spent`: version -> those combiners): its clients refuse a second reveal on the same model, since
    two sums would expose a client."""

    config: SecAggConfig
    spent: dict[int, set[Peer]] = field(default_factory=dict)

    @property
    def coded(self) -> bool:
        """A secure partial is a sum of changes from the round's model, whatever the codec."""
        return True

    @property
    def max_weight(self) -> int:
        """The cap W on a client's public weight: a secure partial of n clients weighs n..n·W."""
        return self.config.max_weight

    @property
    def unmask_s(self) -> float:
        """How long after the deadline the combiners' unmask stages, then their sums, may take."""
        return (UNMASK_STAGES + 1) * self.config.stage_timeout_s

    def admit(self, r: int, live: list[Peer], version: int) -> Admission:
        """Who of the `live` combiners may take part in round `r` on model `version`: not those whose clients already
        revealed a sum on it; when that leaves none, the job stops (no live combiner may run another secure round on
        that model)."""
        spent = self.spent.get(version, set())
        if not spent & set(live):
            return Admission(live)
        note = (f"round {r}: combiners {sorted(map(str, spent & set(live)))} already revealed a sum on model version "
                f"{version} in a round that did not count; they sit out rounds on it")
        left = [c for c in live if c not in spent]
        if left:
            return Admission(left, note)
        return Admission(left, note, stop=(
            f"round {r}: no combiner can advance model version {version}: {', '.join(sorted(map(str, spent)))} "
            "already revealed their clients' secure sums on it in rounds that did not count, and their clients "
            "refuse a second sum on the same model (the difference would expose a client); relax validity "
            "(min_updates, min_fraction_examples) or add clusters, then run the job again"))

    def after_round(self, red: Reduction, why: str | None, version: int) -> None:
        """A round on model `version` that did not count (`why`) spent the sums its combiners revealed."""
        if why is not None and red.revealed:
            self.spent.setdefault(version, set()).update(red.revealed)

    def detail(self, red: Reduction) -> dict[str, Any]:
        """What the round's record keeps of secure aggregation."""
        return {"secure": {"error_bound": red.error_bound, "dropped": sorted(red.dropped),
                           "protocol_bytes": red.protocol_bytes, "weight": red.weight}}


@dataclass(frozen=True, slots=True)
class NoRoundPrivacy:
    """Rounds without differential privacy: `per_round` clients (all when None) drawn from the job's `seed` (the
    same draw on a restart), the reduction's mean released, nothing spent or recorded."""

    seed: int
    per_round: int | None = None

    def exhausted(self) -> str | None:
        """Why the budget forbids one more round: there is none."""
        return None

    def sample(self, connected: Sequence[Peer], round: int) -> list[Peer]:
        """Round `round`'s clients among `connected` (sorted), from the job's seed."""
        k = self.per_round or len(connected)
        return sorted(random.Random(self.seed * SEED_STRIDE + round).sample(list(connected), min(k, len(connected))))

    def spend(self) -> None:
        """A round run costs nothing."""
        return None

    def metrics(self, spent: None) -> dict[str, float]:
        """Nothing to add to a round's metrics."""
        return {}

    def invalid(self, red: Reduction) -> str | None:
        """Why the round does not count: the reduction's reason."""
        return red.invalid()

    def release(self, red: Reduction) -> dict[str, Any]:
        """The round's mean, as the reduction computed it."""
        return red.result()

    def detail(self, spent: None = None) -> dict[str, Any]:
        """What a round's record and the status file keep of differential privacy: nothing."""
        return {}


def secure_policy(job: FederatedJob) -> PlainRounds | SecureRounds:
    """The controller's rounds with or without secure aggregation, as `job` says."""
    return PlainRounds() if job.secure_aggregation is None else SecureRounds(job.secure_aggregation)


def privacy_policy(job: FederatedJob, trail: ModelTrail | None) -> NoRoundPrivacy | RoundPrivacy:
    """The controller's differential privacy, as `job` says, resumed from `trail`. Its accountant resumes from the
    trail: before the trail is open (`trail` None) the controller draws and reports as without it (it draws no
    round's clients before then)."""
    if job.differential_privacy is None or trail is None:
        return NoRoundPrivacy(job.seed, job.clients_per_round)
    return RoundPrivacy(job, trail)
