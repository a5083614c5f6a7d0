"""Krum and Multi-Krum (Blanchard et al., 2017): keep the updates closest to their neighbours."""
from __future__ import annotations

from typing import Sequence

from nebula.federated.aggregate import Update, multi_krum
from nebula.mean import Weights
from nebula.federated.strategy import Strategy, register_strategy

__all__ = ["Krum", "MultiKrum"]


@register_strategy("krum")
class Krum(Strategy):
    """The one update with the lowest Krum score, assuming up to `num_byzantine` attackers per combiner."""

    streaming = False

    def __init__(self, num_byzantine: int = 1) -> None:
        if num_byzantine < 0:
            raise ValueError(f"krum num_byzantine={num_byzantine} must be >= 0")
        self.num_byzantine = int(num_byzantine)

    def _selected(self, n: int) -> int:
        return 1

    def combine(self, updates: Sequence[Update], clients: Sequence[str] | None = None) -> Weights:
        # too few updates for the assumed attackers: assume as many as the updates allow
        f = min(self.num_byzantine, max(0, (len(updates) - 3) // 2))
        return multi_krum(updates, f, min(self._selected(len(updates)), len(updates)), clients)


@register_strategy("multi_krum")
class MultiKrum(Krum):
    """The mean of the `num_selected` updates with the lowest Krum scores (default n − f)."""

    def __init__(self, num_byzantine: int = 1, num_selected: int | None = None) -> None:
        super().__init__(num_byzantine)
        if num_selected is not None and num_selected < 1:
            raise ValueError(f"multi_krum num_selected={num_selected} must be >= 1, or left out for n - f")
        self.num_selected = num_selected

    def _selected(self, n: int) -> int:
        return self.num_selected if self.num_selected is not None else max(1, n - self.num_byzantine)
