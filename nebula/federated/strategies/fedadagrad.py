"""FedAdagrad (Reddi et al., 2021, Algorithm 2): Adagrad's accumulated second moment on the server.

With Δ = mean(client models) − x: m ← β1·m + (1−β1)·Δ;  v ← v + Δ²;  x ← x + η·m / (√v + τ).
m starts at 0 and v at τ² (the paper's v₋₁ ≥ τ²); both travel with the model trail. Unlike FedAdam's, v never
forgets, so the step shrinks for coordinates that keep moving. (Flower's FedAdagrad fixes β1 = 0 and starts v
at 0; `beta_1: 0` here gives its momentum-free form, v still starting at τ².)
"""
from __future__ import annotations

import numpy as np

from nebula.federated.strategies.fedopt import _FedOpt
from nebula.federated.strategy import register_strategy

__all__ = ["FedAdagrad"]


@register_strategy("fedadagrad")
class FedAdagrad(_FedOpt):
    """FedAdagrad: the sum of squared pseudo-gradients as the second moment (no beta_2)."""

    def __init__(self, eta: float = 0.01, beta_1: float = 0.9, tau: float = 1e-3) -> None:
        super().__init__(eta, beta_1, 0.0, tau)
        del self.beta_2  # Adagrad has none; keep it out of describe()

    def _second_moment(self, v: np.ndarray, d2: np.ndarray) -> np.ndarray:
        return v + d2
