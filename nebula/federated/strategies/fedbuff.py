"""FedBuff (Nguyen et al., 2022): buffer K staleness-weighted client deltas, then one server step.

Each update contributes Δ_i = (x_client − x_base)·s(τ_i) (s from FedAsync); after K of them
x ← x + η_g·mean(Δ). The buffer (a running mean and its count) is server state, kept with the model trail.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from nebula.federated.strategies.fedasync import staleness_weight
from nebula.mean import Weights
from nebula.federated.strategy import AsyncStrategy, State, register_strategy

__all__ = ["FedBuff"]


@register_strategy("fedbuff")
class FedBuff(AsyncStrategy):
    """K updates per server step; `server_lr` scales the buffered mean delta."""

    def __init__(self, buffer_size: int = 10, server_lr: float = 1.0, staleness: str = "polynomial",
                 a: float = 0.5, b: int = 4) -> None:
        if buffer_size < 1:
            raise ValueError(f"fedbuff buffer_size={buffer_size} must be >= 1 (K updates per server step)")
        if not server_lr > 0:
            raise ValueError(f"fedbuff server_lr={server_lr} must be > 0")
        staleness_weight(0, staleness, a, b)
        self.buffer_size, self.server_lr = int(buffer_size), float(server_lr)
        self.staleness, self.a, self.b = staleness, float(a), int(b)

    def on_update(self, global_weights: Mapping[str, np.ndarray], base_weights: Mapping[str, np.ndarray],
                  update: Mapping[str, np.ndarray], num_examples: int, staleness: int,
                  state: State) -> tuple[Weights | None, State]:
        s = staleness_weight(staleness, self.staleness, self.a, self.b)
        count = int(state.get("buffer_count", np.zeros(())).item()) + 1
        new_s = dict(state)
        for k, x in global_weights.items():
            delta = (update[k].astype(np.float64) - base_weights[k].astype(np.float64)) * s
            acc = state.get(f"buffer/{k}", np.zeros_like(delta))
            new_s[f"buffer/{k}"] = acc + (delta - acc) / count
        if count < self.buffer_size:
            new_s["buffer_count"] = np.array(count)
            return None, new_s
        out = {k: (x.astype(np.float64) + self.server_lr * new_s[f"buffer/{k}"]).astype(x.dtype)
               for k, x in global_weights.items()}
        return out, {k: v for k, v in new_s.items() if not k.startswith("buffer")}
