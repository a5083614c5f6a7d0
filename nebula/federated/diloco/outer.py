"""The outer step of cross-cluster data parallelism (pure numpy): plain averaging and DiLoCo's Nesterov momentum.

Every `sync_every` inner steps each cluster sends its pseudo-gradient D_c = anchor - replica_c (how far its replica
moved from the model all clusters last agreed on); the mean D over the clusters is the outer gradient. DiLoCo
(Douillard et al. 2023, Algorithm 1) applies SGD with Nesterov momentum to it, exactly as torch.optim.SGD does:

    buf    <- momentum * buf + D
    update <- D + momentum * buf   (Nesterov)   or   buf   (heavy ball)
    anchor <- anchor - lr * update

Plain periodic averaging is the same step with lr 1 and no momentum: anchor - mean(anchor - replica_c) is the
mean of the replicas.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

__all__ = ["pseudo_gradient", "outer_step", "average_step"]

Weights = Mapping[str, np.ndarray]


def pseudo_gradient(anchor: Weights, replica: Weights) -> dict[str, np.ndarray]:
    """anchor - replica per tensor (ValueError naming the first key or shape that differs)."""
    if set(anchor) != set(replica):
        missing, extra = sorted(set(anchor) - set(replica)), sorted(set(replica) - set(anchor))
        raise ValueError(f"replica keys differ from the anchor's (missing {missing}, unexpected {extra})")
    out = {}
    for k, a in anchor.items():
        if a.shape != replica[k].shape:
            raise ValueError(f"{k!r}: replica shape {replica[k].shape} differs from the anchor's {a.shape}")
        out[k] = a - replica[k]
    return out


def outer_step(anchor: Weights, delta: Weights, buf: Mapping[str, np.ndarray] | None, *, lr: float,
               momentum: float, nesterov: bool = True) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(new anchor, new momentum buffer) after one SGD step with (Nesterov) momentum on pseudo-gradient `delta`.

    `buf` None is the zero buffer of the first outer step. Arrays keep the anchor's dtype.
    """
    if not lr > 0 or not 0 <= momentum < 1:
        raise ValueError(f"outer step: lr={lr} must be > 0 and momentum={momentum} in [0, 1)")
    new_anchor, new_buf = {}, {}
    for k, a in anchor.items():
        d = np.asarray(delta[k], dtype=a.dtype)
        if d.shape != a.shape:
            raise ValueError(f"{k!r}: pseudo-gradient shape {d.shape} differs from the model's {a.shape}")
        b = d.copy() if buf is None else momentum * buf[k] + d
        update = d + momentum * b if nesterov else b
        new_anchor[k] = (a - lr * update).astype(a.dtype, copy=False)
        new_buf[k] = b.astype(a.dtype, copy=False)
    return new_anchor, new_buf


def average_step(anchor: Weights, delta: Weights) -> dict[str, np.ndarray]:
    """anchor - delta: with `delta` the mean pseudo-gradient, the mean of the replicas."""
    return {k: (a - np.asarray(delta[k], dtype=a.dtype)).astype(a.dtype, copy=False) for k, a in anchor.items()}
