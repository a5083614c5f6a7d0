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

from nebula.balance.base import register, require_fit
from nebula.balance.cost import Allocation, AllocationError, DeviceProfile, LayerCost, Problem, evaluate

__all__ = ["min_bottleneck", "min_bottleneck_matrices", "allocate_optimal"]


def min_bottleneck_matrices(costs: Sequence[np.ndarray]) -> tuple[float, list[int]]:
    """Exact min-max partition given each device's (L+1)x(L+1) stage-time matrix in order; (inf, []) if none fits."""
    n = costs[0].shape[0] - 1
    best = np.full(n + 1, math.inf)
    best[0] = 0.0
    back = np.empty((len(costs), n + 1), dtype=np.int64)
    cols = np.arange(n + 1)
    for k, c in enumerate(costs):
        m = np.maximum(best[:, None], c)
        arg = np.argmin(m, axis=0)
        best = m[arg, cols]
        back[k] = arg
    if not math.isfinite(best[n]):
        return math.inf, []
    bounds = [n]
    for k in range(len(costs) - 1, -1, -1):
        bounds.append(int(back[k][bounds[-1]]))
    return float(best[n]), bounds[::-1]


def min_bottleneck(prob: Problem, devices: Sequence[DeviceProfile]) -> tuple[float, list[int]]:
    """Exact min-max partition of `prob` over `devices` in the given order; (inf, []) if nothing fits."""
    return min_bottleneck_matrices([prob.cost_matrix(d) for d in devices])


@register("optimal")
def allocate_optimal(layers: Sequence[LayerCost], devices: Sequence[DeviceProfile]) -> Allocation:
    """The exact minimum-bottleneck allocation in the given device order."""
    prob = Problem.of(layers)
    t, bounds = min_bottleneck(prob, devices)
    if not bounds:
        require_fit(prob, devices)
        raise AllocationError("no partition fits the memory caps in this device order")  # require_fit names why
    return evaluate("optimal", bounds, prob, devices, lower_bound_s=t)
