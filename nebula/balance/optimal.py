"""`optimal`: the exact minimum-bottleneck partition for a fixed device order, by dynamic programming.

Sky Computing §IV-C writes the problem as a MILP and calls it NP-hard. With the device order fixed and each device
holding one contiguous range it is not: let ``best[k][b]`` be the smallest bottleneck of devices 0..k covering
layers 0..b-1; then ``best[k][b] = min_a max(best[k-1][a], stage_time(k, a, b))`` with stage_time = inf where the
range overflows device k's memory. That is O(D * L^2) work, done one device at a time as a vectorised (L+1)^2
min-max, so 160 layers x 64 devices take milliseconds. The communication term depends only on the range's last
layer, so it fits the recursion exactly. Ties keep the smallest first layer for each device (deterministic).
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from nebula.balance.base import register_allocator, require_fit
from nebula.balance.cost import Allocation, AllocationError, DeviceProfile, LayerCost, Problem, evaluate

__all__ = ["step", "min_bottleneck", "min_bottleneck_matrices", "allocate_optimal"]


def step(row: np.ndarray, cost: np.ndarray, pos: int, num_devices: int) -> tuple[np.ndarray, np.ndarray]:
    """One device of the recursion: (new row, argmin start per end) for the device at position `pos` of the order.

    Only starts a in [pos, L-D+pos] and ends b in [pos+1, L-D+pos+1] can lead to a full partition (every device holds
    a layer), so the min-max runs on that window alone; elsewhere the new row is inf.
    """
    n = len(row) - 1
    lo, hi = pos, n - num_devices + pos  # inclusive range of starts
    m = np.maximum(row[lo:hi + 1, None], cost[lo:hi + 1, lo + 1:hi + 2])
    arg = np.argmin(m, axis=0)
    out = np.full(n + 1, math.inf)
    out[lo + 1:hi + 2] = m[arg, np.arange(m.shape[1])]
    back = np.zeros(n + 1, dtype=np.int64)
    back[lo + 1:hi + 2] = arg + lo
    return out, back


def min_bottleneck_matrices(costs: Sequence[np.ndarray]) -> tuple[float, list[int]]:
    """Exact min-max partition given each device's (L+1)x(L+1) stage-time matrix in order; (inf, []) if none fits."""
    n, d = costs[0].shape[0] - 1, len(costs)
    best = np.full(n + 1, math.inf)
    best[0] = 0.0
    backs = []
    for k, c in enumerate(costs):
        best, back = step(best, c, k, d)
        backs.append(back)
    if not math.isfinite(best[n]):
        return math.inf, []
    bounds = [n]
    for k in range(d - 1, -1, -1):
        bounds.append(int(backs[k][bounds[-1]]))
    return float(best[n]), bounds[::-1]


def min_bottleneck(prob: Problem, devices: Sequence[DeviceProfile]) -> tuple[float, list[int]]:
    """Exact min-max partition of `prob` over `devices` in the given order; (inf, []) if nothing fits."""
    return min_bottleneck_matrices([prob.cost_matrix(d) for d in devices])


@register_allocator("optimal")
def allocate_optimal(layers: Sequence[LayerCost], devices: Sequence[DeviceProfile]) -> Allocation:
    """The exact minimum-bottleneck allocation in the given device order."""
    prob = Problem.of(layers)
    t, bounds = min_bottleneck(prob, devices)
    if not bounds:
        require_fit(prob, devices)
        raise AllocationError("no partition fits the memory caps in this device order")  # require_fit names why
    return evaluate("optimal", bounds, prob, devices, lower_bound_s=t)
