"""`milp`: the allocation as a mixed-integer program solved by scipy's HiGHS, to verify the other methods.

Sky Computing §IV-C uses x[i,j] (device i holds layer j) with big-M contiguity constraints. This module uses an
equivalent, tighter encoding: u[k,j] = 1 iff layer j sits on one of devices 0..k. Contiguity is then
``u[k,j] >= u[k,j+1]`` and ``u[k,j] <= u[k+1,j]``; device k holds ``x[k,j] = u[k,j] - u[k-1,j]``; its range ends
after layer j iff ``e[k,j] = u[k,j] - u[k,j+1] = 1``, which prices the communication term exactly. Objective:
min q with q >= compute_k + comm_k for every k, memory caps, and at least one layer per device.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from nebula.balance.base import register_allocator, require_fit
from nebula.balance.cost import Allocation, AllocationError, DeviceProfile, LayerCost, Problem, evaluate

__all__ = ["allocate_milp"]


@register_allocator("milp")
def allocate_milp(layers: Sequence[LayerCost], devices: Sequence[DeviceProfile],
                  time_limit_s: float = 60.0) -> Allocation:
    """Solve the fixed-order allocation MILP with HiGHS; `notes['proven_optimal']` says if it closed the gap."""
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import lil_matrix

    prob = Problem.of(layers)
    require_fit(prob, devices)
    n, d = len(layers), len(devices)
    f = np.array([x.flops for x in layers], dtype=float)
    m = np.array([x.memory_bytes for x in layers], dtype=float)
    act = np.array([x.activation_bytes for x in layers], dtype=float)
    nu = (d - 1) * n  # u[k, j] for k < d-1 (u[d-1, j] = 1, u[-1, j] = 0 are constants)
    q = nu

    def u(k: int, j: int) -> int:
        return k * n + j

    rows: list[tuple[dict[int, float], float, float]] = []  # (coefficients, lower, upper)
    for k in range(d - 1):
        for j in range(n - 1):
            rows.append(({u(k, j): 1.0, u(k, j + 1): -1.0}, 0.0, math.inf))  # prefix property
        if k + 1 < d - 1:
            for j in range(n):
                rows.append(({u(k + 1, j): 1.0, u(k, j): -1.0}, 0.0, math.inf))  # nested prefixes
    # stage-time rows are divided by the fluid bound (every device busy until the model's FLOPs are done), which is
    # close to the optimum, so that HiGHS's absolute tolerances (1e-6) are relative to the bottleneck itself
    scale = max(f.sum() / sum(1.0 / dev.time_per_flop_s for dev in devices), 1e-30)
    for k, dev in enumerate(devices):
        x: dict[int, float] = {}  # x[k, j] = u[k, j] - u[k-1, j] as coefficients over u, plus a constant
        for j in range(n):
            if k < d - 1:
                x[u(k, j)] = x.get(u(k, j), 0.0) + 1.0
            if k > 0:
                x[u(k - 1, j)] = x.get(u(k - 1, j), 0.0) - 1.0
        rows.append((dict(x), 1.0 - _const(k, d, n), math.inf))  # at least one layer
        if dev.memory_bytes < math.inf:
            mem = {i: c * m[i % n] for i, c in x.items()}
            rows.append((mem, -math.inf, dev.memory_bytes - _const(k, d, n, m)))
        # q - compute_k - comm_k >= 0, divided by `scale`
        row = {i: -c * dev.time_per_flop_s * f[i % n] / scale for i, c in x.items()}
        rhs = _const(k, d, n, f) * dev.time_per_flop_s / scale
        if k < d - 1:
            ce = (dev.latency_s + act / dev.bandwidth_bytes_per_s) / scale
            for j in range(n):  # e[k, j] = u[k, j] - u[k, j+1]; u[k, n] = 0
                row[u(k, j)] = row.get(u(k, j), 0.0) - ce[j]
                if j + 1 < n:
                    row[u(k, j + 1)] = row.get(u(k, j + 1), 0.0) + ce[j]
        row[q] = 1.0  # q is kept in units of `scale`
        rows.append((row, rhs, math.inf))
    a = lil_matrix((len(rows), nu + 1))
    lo, hi = np.empty(len(rows)), np.empty(len(rows))
    for r, (coef, l, h) in enumerate(rows):
        for i, c in coef.items():
            if c:
                a[r, i] = c
        lo[r], hi[r] = l, h
    c = np.zeros(nu + 1)
    c[q] = 1.0
    integrality = np.ones(nu + 1)
    integrality[q] = 0
    res = milp(c, constraints=LinearConstraint(a.tocsr(), lo, hi), integrality=integrality,
               bounds=Bounds(np.r_[np.zeros(nu), 0.0], np.r_[np.ones(nu), np.inf]),
               options={"time_limit": time_limit_s, "mip_rel_gap": 1e-9})
    if res.x is None:
        raise AllocationError(f"milp: HiGHS found no allocation ({res.message}); try a longer time_limit_s")
    uu = np.round(res.x[:nu]).reshape(d - 1, n) if d > 1 else np.zeros((0, n))
    bounds = [0] + [int(uu[k].sum()) for k in range(d - 1)] + [n]
    proven = res.status == 0
    bound = getattr(res, "mip_dual_bound", None)
    lower = float(bound) * scale if bound is not None and math.isfinite(bound) else None
    return evaluate("milp", bounds, prob, devices, lower_bound_s=lower, notes={"proven_optimal": proven,
                                                                             "message": res.message})


def _const(k: int, d: int, n: int, weights: np.ndarray | None = None) -> float:
    """Constant part of sum_j w_j x[k, j]: only the last device's u[d-1, j] = 1 contributes."""
    if k != d - 1:
        return 0.0
    return float(n if weights is None else weights.sum())
