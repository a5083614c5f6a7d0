"""What a job's privacy settings make of a combiner's rounds, decided here once and nowhere else in the combiner:

- which round serves the controller's `StartRound` (`round_kind`): "secure" under secure aggregation (the combiner
  learns only its clients' sum: `combiner.secure.SecureRound`), "sync" otherwise (`combiner.rounds.SyncRound`), each
  registered by that name in `combiner.rounds.ROUNDS`; every round answers the clients' updates and their secure
  aggregation stage messages (a round without secure aggregation refuses the latter);
- how each update in the clear is weighed and bounded as it is folded (`fold_policy`): as it came, weighted by its
  examples (`FoldPolicy()`); under differential privacy every update weighs the same (`FoldPolicy(unit_weight=True)`),
  and under central DP the combiner clips it to `clip_norm` itself first (`CentralClip`), whatever its client did.

The fold policies are pure: the round does the I/O (the pieces, the audit log) around them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

from nebula.federated.config import FederatedJob
from nebula.federated.intake import GlobalModel, clip_pieces
from nebula.federated.privacy import clip_factor

__all__ = ["FoldPolicy", "CentralClip", "fold_policy", "round_kind", "CLIP_SLACK"]

UpdatePieces = Iterator[tuple[str, int, np.ndarray]]  # (tensor, element offset, values) of one update
Record = tuple[str, str, dict[str, Any]]  # an audit record of the combiner's cluster: (action, outcome, detail)
# an update counts as clipped (logged, audited) when its norm is this much over clip_norm, relative; it is scaled to
# clip_norm whenever it is over at all (an honest client's clipped change, sent as float32 weights and measured
# again, can be over by rounding alone)
CLIP_SLACK = 1e-4


@dataclass(frozen=True, slots=True)
class FoldPolicy:
    """Each update folded as it came; `unit_weight`: every update weighs the same (differential privacy: the mean's
    denominator is the number of updates, never the examples one client claims)."""

    unit_weight: bool = False

    @property
    def measures(self) -> bool:
        """Whether each update's change from the round's model must be measured for this policy: no."""
        return False

    def clip(self, norm: float | None, pieces: UpdatePieces, base: GlobalModel | None) -> tuple[UpdatePieces, dict[str, Any]]:
        """(The update's pieces to fold, what its audit record adds): as they came, nothing."""
        return pieces, {}

    def round_records(self, round: int, clipped: int) -> list[Record]:
        """What the end of round `round` adds to the audit log: nothing."""
        return []


@dataclass(frozen=True, slots=True)
class CentralClip:
    """Central differential privacy at the combiner: every update's change from the round's model (its L2 norm, as
    decoded) scaled to at most `clip_norm` before it is folded, and every update weighs the same. An update whose
    norm is not finite is refused (ValueError from `clip`); each one clipped is audited with its update, their
    count with the round (`fl.dp` "clipped")."""

    clip_norm: float

    def __post_init__(self) -> None:
        if not (np.isfinite(self.clip_norm) and self.clip_norm > 0):
            raise ValueError(f"differential_privacy.clip_norm={self.clip_norm} must be > 0; set a positive bound")

    @property
    def unit_weight(self) -> bool:
        return True

    @property
    def measures(self) -> bool:
        """Each update's change from the round's model is measured (raw updates; a coded one is a change already)."""
        return True

    def clip(self, norm: float | None, pieces: UpdatePieces, base: GlobalModel | None) -> tuple[UpdatePieces, dict[str, Any]]:
        """(The update's pieces scaled to clip_norm, what its audit record adds: `clipped` when it was over);
        ValueError when its norm is not finite."""
        factor = clip_factor(norm, self.clip_norm)
        pieces = clip_pieces(pieces, factor, base)
        if norm > self.clip_norm * (1 + CLIP_SLACK):
            return pieces, {"clipped": True, "clip_norm": self.clip_norm}
        return pieces, {}

    def round_records(self, round: int, clipped: int) -> list[Record]:
        """What the end of round `round` adds to the audit log: how many of its updates were clipped."""
        return [("fl.dp", "clipped", {"round": round, "clipped": clipped, "clip_norm": self.clip_norm})]


def fold_policy(job: FederatedJob) -> FoldPolicy | CentralClip:
    """How the combiners of `job` fold each update in the clear."""
    dp = job.differential_privacy
    if dp is None:
        return FoldPolicy()
    # central DP: every update is clipped at the combiner (masked ones cannot be: the job file refuses that
    # combination)
    if dp.mode == "central" and job.secure_aggregation is None:
        return CentralClip(dp.clip_norm)
    return FoldPolicy(unit_weight=True)


def round_kind(job: FederatedJob) -> str:
    """The name (in `combiner.rounds.ROUNDS`) of the round that serves `job`'s synchronous rounds."""
    return "sync" if job.secure_aggregation is None else "secure"
