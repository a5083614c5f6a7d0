"""Aggregation math (the federated ground floor, docs/architecture.md): pure functions over lists of
`(weights, num_examples)`. (The streaming mean and the check of one update: `nebula.mean`.)

Every function checks its input first (`check_updates`): the same keys, shapes and floating dtypes in every
update, finite values, a positive example count. A bad update raises `ValueError` naming the client (its index,
or the name given in `clients`) and the problem.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

from nebula.mean import check_model_update

__all__ = ["Update", "check_updates", "fedavg", "trimmed_mean", "median", "krum", "multi_krum"]

Update = tuple[Mapping[str, np.ndarray], int]


def _who(i: int, clients: Sequence[str] | None) -> str:
    return f"client {clients[i]!r}" if clients is not None else f"update {i}"


def check_updates(updates: Sequence[Update], clients: Sequence[str] | None = None,
                  like: Mapping[str, np.ndarray] | None = None) -> None:
    """Check a list of updates against each other (and `like`, when given); ValueError names the client."""
    if not updates:
        raise ValueError("no updates to aggregate; wait for at least one client")
    if clients is not None and len(clients) != len(updates):
        raise ValueError(f"{len(clients)} client names for {len(updates)} updates; give one name per update")
    for i, u in enumerate(updates):
        if not isinstance(u, tuple) or len(u) != 2:
            raise ValueError(f"{_who(i, clients)}: expected a (weights, num_examples) pair, got {type(u).__name__}")
        check_model_update(u[0], u[1], _who(i, clients), like if like is not None else (updates[0][0] if i else None))


def fedavg(updates: Sequence[Update], clients: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """Weighted mean, weights proportional to num_examples (McMahan et al., eq. 1 of FEDn)."""
    check_updates(updates, clients)
    total = float(sum(n for _, n in updates))
    out = {}
    for name, ref in updates[0][0].items():
        acc = np.zeros(ref.shape, np.float64)
        for w, n in updates:
            acc += w[name].astype(np.float64) * (n / total)
        out[name] = acc.astype(ref.dtype)
    return out


def _stack(updates: Sequence[Update], name: str) -> np.ndarray:
    return np.stack([w[name] for w, _ in updates])


def trimmed_mean(updates: Sequence[Update], trim_ratio: float = 0.1,
                 clients: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """Coordinate-wise trimmed mean (Yin et al. 2018): drop the floor(trim_ratio * n) largest and smallest values."""
    if not 0 <= trim_ratio < 0.5:
        raise ValueError(f"trim_ratio={trim_ratio} must be in [0, 0.5); 0.1 drops a tenth at each end")
    check_updates(updates, clients)
    k = int(math.floor(trim_ratio * len(updates)))
    out = {}
    for name, ref in updates[0][0].items():
        s = np.sort(_stack(updates, name), axis=0)
        out[name] = s[k:len(updates) - k].mean(axis=0, dtype=np.float64).astype(ref.dtype)
    return out


def median(updates: Sequence[Update], clients: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """Coordinate-wise median (Yin et al. 2018)."""
    check_updates(updates, clients)
    return {name: np.median(_stack(updates, name), axis=0).astype(ref.dtype) for name, ref in updates[0][0].items()}


def _krum_scores(updates: Sequence[Update], num_byzantine: int) -> np.ndarray:
    n = len(updates)
    flat = np.stack([np.concatenate([w[k].ravel().astype(np.float64) for k in sorted(w)]) for w, _ in updates])
    sq = (flat * flat).sum(axis=1)
    d = np.maximum(sq[:, None] + sq[None, :] - 2.0 * flat @ flat.T, 0.0)
    closest = n - num_byzantine - 2
    scores = np.empty(n)
    for i in range(n):
        others = np.delete(d[i], i)
        scores[i] = np.sort(others)[:closest].sum()
    return scores


def multi_krum(updates: Sequence[Update], num_byzantine: int, num_selected: int,
               clients: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """Multi-Krum (Blanchard et al. 2017): the plain mean of the `num_selected` updates with the lowest Krum score.

    The score of update i is the sum of squared distances to its n - f - 2 nearest other updates; n > 2f + 2.
    """
    check_updates(updates, clients)
    n = len(updates)
    if num_byzantine < 0 or n <= 2 * num_byzantine + 2:
        raise ValueError(f"Krum with num_byzantine={num_byzantine} needs more than {2 * num_byzantine + 2} updates, "
                         f"got {n}; lower num_byzantine or wait for more clients")
    if not 1 <= num_selected <= n:
        raise ValueError(f"num_selected={num_selected} must be between 1 and the {n} updates")
    chosen = np.argsort(_krum_scores(updates, num_byzantine), kind="stable")[:num_selected]
    out = {}
    for name, ref in updates[0][0].items():
        out[name] = np.mean([updates[i][0][name].astype(np.float64) for i in chosen], axis=0).astype(ref.dtype)
    return out


def krum(updates: Sequence[Update], num_byzantine: int, clients: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """Krum (Blanchard et al. 2017): the one update closest to its n - f - 2 nearest neighbours."""
    return multi_krum(updates, num_byzantine, 1, clients)
