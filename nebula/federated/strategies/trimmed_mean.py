"""Byzantine-robust distributed learning (Yin et al., 2018): coordinate-wise trimmed mean and median.

Both need every update of a combiner at once (a sort per coordinate), so they are not streaming: a combiner
running them holds its clients' updates for the round. The reducer then takes the example-weighted mean of the
combiners' robust partials.
"""
from __future__ import annotations

from typing import Sequence

from nebula.federated.aggregate import Update, median, trimmed_mean
from nebula.mean import Weights
from nebula.federated.strategy import Strategy, register_strategy

__all__ = ["TrimmedMean", "Median"]


@register_strategy("trimmed_mean")
class TrimmedMean(Strategy):
    """Drop the `trim_ratio` largest and smallest values of every coordinate, average the rest."""

    streaming = False

    def __init__(self, trim_ratio: float = 0.2) -> None:
        if not 0 <= trim_ratio < 0.5:
            raise ValueError(f"trimmed_mean trim_ratio={trim_ratio} must be in [0, 0.5)")
        self.trim_ratio = float(trim_ratio)

    def combine(self, updates: Sequence[Update], clients: Sequence[str] | None = None) -> Weights:
        return trimmed_mean(updates, self.trim_ratio, clients)


@register_strategy("median")
class Median(Strategy):
    """The coordinate-wise median of the updates."""

    streaming = False

    def combine(self, updates: Sequence[Update], clients: Sequence[str] | None = None) -> Weights:
        return median(updates, clients)
