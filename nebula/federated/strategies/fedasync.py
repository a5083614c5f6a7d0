"""FedAsync (Xie et al., 2019): x ← (1 − α_t)·x + α_t·x_client with α_t = α·s(staleness).

Staleness functions of the paper: constant s = 1; polynomial s(τ) = (τ + 1)^(−a); hinge s(τ) = 1 for τ ≤ b,
else 1 / (a·(τ − b) + 1).
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from nebula.mean import Weights
from nebula.federated.strategy import AsyncStrategy, State, register_strategy

__all__ = ["FedAsync", "staleness_weight", "STALENESS"]

STALENESS = ("constant", "polynomial", "hinge")


def staleness_weight(staleness: int, kind: str = "polynomial", a: float = 0.5, b: int = 4) -> float:
    """s(τ) of the FedAsync paper for `kind` in constant, polynomial, hinge."""
    if staleness < 0:
        raise ValueError(f"staleness {staleness} < 0: an update claims a model version newer than the server's")
    if kind == "constant":
        return 1.0
    if kind == "polynomial":
        return float((staleness + 1) ** (-a))
    if kind == "hinge":
        return 1.0 if staleness <= b else 1.0 / (a * (staleness - b) + 1.0)
    raise ValueError(f"staleness function {kind!r} is not one of {', '.join(STALENESS)}")


@register_strategy("fedasync")
class FedAsync(AsyncStrategy):
    """Mix each update into the global model as it arrives, less the staler it is."""

    def __init__(self, alpha: float = 0.6, staleness: str = "polynomial", a: float = 0.5, b: int = 4) -> None:
        if not 0 < alpha <= 1:
            raise ValueError(f"fedasync alpha={alpha} must be in (0, 1] (the paper uses 0.6 to 0.9)")
        staleness_weight(0, staleness, a, b)
        self.alpha, self.staleness, self.a, self.b = float(alpha), staleness, float(a), int(b)

    def on_update(self, global_weights: Mapping[str, np.ndarray], base_weights: Mapping[str, np.ndarray],
                  update: Mapping[str, np.ndarray], num_examples: int, staleness: int,
                  state: State) -> tuple[Weights | None, State]:
        at = self.alpha * staleness_weight(staleness, self.staleness, self.a, self.b)
        out = {k: ((1 - at) * x.astype(np.float64) + at * update[k].astype(np.float64)).astype(x.dtype)
               for k, x in global_weights.items()}
        return out, state
