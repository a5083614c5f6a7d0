"""Adaptive Federated Optimization (Reddi et al., 2021): FedAdam and FedYogi, server optimisers on the mean delta.

Algorithm 2 of the paper, with Δ = mean(client models) − x (the pseudo-gradient):
m ← β1·m + (1−β1)·Δ;  Adam: v ← β2·v + (1−β2)·Δ²;  Yogi: v ← v − (1−β2)·Δ²·sign(v − Δ²);
x ← x + η·m / (√v + τ).  m starts at 0 and v at τ² (the paper's v₋₁ ≥ τ²); both travel with the model trail.

FedAdam's `bias_correction: true` is the server Adam that Flower ships instead: m and v start at 0 and the step
is scaled as in Kingma & Ba (2015, Alg. 1), η_t = η·√(1 − β2^t) / (1 − β1^t) with t the server steps taken
(kept in the trail as `step`). Flower computes the same factor with exponent server_round + 1, its rounds
counting from 1, so its round r uses the factor of Nebula's t = r + 1. The default (false) is the paper's
Algorithm 2 as above. Their first steps: corrected η·Δ/(|Δ| + τ/√(1 − β2)), about η·sign(Δ) for |Δ| ≫ τ; the
paper's η·(1 − β1)·Δ/(√(β2τ² + (1 − β2)Δ²) + τ), the same size for |Δ| ≫ τ only when 1 − β1 = √(1 − β2).
FedAdagrad (v ← v + Δ²) lives in `fedadagrad`.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from nebula.mean import Weights
from nebula.federated.strategy import State, Strategy, register_strategy

__all__ = ["FedAdam", "FedYogi"]


class _FedOpt(Strategy):
    def __init__(self, eta: float = 0.01, beta_1: float = 0.9, beta_2: float = 0.99, tau: float = 1e-3) -> None:
        if not eta > 0:
            raise ValueError(f"{self.name} eta={eta} must be > 0 (the server learning rate, e.g. 0.01)")
        for n, b in (("beta_1", beta_1), ("beta_2", beta_2)):
            if not 0 <= b < 1:
                raise ValueError(f"{self.name} {n}={b} must be in [0, 1) (e.g. 0.9 and 0.99)")
        if not tau > 0:
            raise ValueError(f"{self.name} tau={tau} must be > 0 (adaptivity, e.g. 1e-3)")
        self.eta, self.beta_1, self.beta_2, self.tau = float(eta), float(beta_1), float(beta_2), float(tau)

    def _second_moment(self, v: np.ndarray, d2: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _v0(self) -> float:
        return self.tau ** 2

    def _step_size(self, state: State, new_s: State) -> float:
        return self.eta

    def server_step(self, global_weights: Mapping[str, np.ndarray], mean: Mapping[str, np.ndarray],
                    state: State) -> tuple[Weights, State]:
        new_w, new_s = {}, dict(state)
        eta = self._step_size(state, new_s)
        for k, x in global_weights.items():
            x64 = x.astype(np.float64)
            delta = mean[k].astype(np.float64) - x64
            m = state.get(f"m/{k}", np.zeros_like(x64))
            v = state.get(f"v/{k}", np.full_like(x64, self._v0()))
            m = self.beta_1 * m + (1 - self.beta_1) * delta
            v = self._second_moment(v, delta * delta)
            new_s[f"m/{k}"], new_s[f"v/{k}"] = m, v
            new_w[k] = (x64 + eta * m / (np.sqrt(v) + self.tau)).astype(x.dtype)
        return new_w, new_s


@register_strategy("fedadam")
class FedAdam(_FedOpt):
    """FedAdam: Adam's second moment on the pseudo-gradient; `bias_correction` for Kingma & Ba's (and Flower's)."""

    def __init__(self, eta: float = 0.01, beta_1: float = 0.9, beta_2: float = 0.99, tau: float = 1e-3,
                 bias_correction: bool = False) -> None:
        super().__init__(eta, beta_1, beta_2, tau)
        if not isinstance(bias_correction, bool):
            raise ValueError(f"fedadam bias_correction={bias_correction!r} must be true or false")
        self.bias_correction = bias_correction

    def _v0(self) -> float:
        return 0.0 if self.bias_correction else self.tau ** 2

    def _step_size(self, state: State, new_s: State) -> float:
        if not self.bias_correction:
            return self.eta
        t = int(np.asarray(state.get("step", 0))) + 1
        new_s["step"] = np.array(t)
        return self.eta * np.sqrt(1 - self.beta_2 ** t) / (1 - self.beta_1 ** t)

    def _second_moment(self, v: np.ndarray, d2: np.ndarray) -> np.ndarray:
        return self.beta_2 * v + (1 - self.beta_2) * d2


@register_strategy("fedyogi")
class FedYogi(_FedOpt):
    """FedYogi: Yogi's additive, sign-controlled second moment on the pseudo-gradient."""

    def _second_moment(self, v: np.ndarray, d2: np.ndarray) -> np.ndarray:
        return v - (1 - self.beta_2) * d2 * np.sign(v - d2)
