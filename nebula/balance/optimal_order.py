"""`optimal-order`: choose the device order as well as the cut points.

Exact when the subset recursion is small (at most `EXACT_MAX_DEVICES` devices and `EXACT_MAX_WORK` element
operations, e.g. 9 devices x 163 layers or 13 devices x 43 layers) by dynamic programming over subsets:
``best[S][b]`` is the smallest bottleneck with which the devices of set S, in some order, cover layers 0..b-1;
adding device i after them gives ``min_a max(best[S][a], stage_time(i, a, b))`` (O(2^D * D * L^2), vectorised per
(S, i), each device's window of possible cut points only).

Beyond that, a search: every device's stage-time matrix is built once; candidate orders (as given, as given with
the slowest device last, fastest first, slowest first, most memory first) are solved exactly by `optimal`'s
recursion, and the best one is improved by local search: swap the bottleneck device with every other position
(the recursion restarts from the first changed position, earlier rows are kept), take the best improving swap,
repeat until none improves or `max_rounds`.
The result reports `lower_bound_s`, the best bound this module knows for any order (`order_lower_bound`: layer
counts that fit each device, a fluid bound, the k slowest devices), so ``Allocation.gap`` says how far from optimal
it can be.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from nebula.balance.base import register_allocator
from nebula.balance.cost import Allocation, AllocationError, DeviceProfile, LayerCost, Problem, evaluate
from nebula.balance.optimal import min_bottleneck_matrices, step

__all__ = ["EXACT_MAX_DEVICES", "EXACT_MAX_WORK", "allocate_optimal_order", "order_lower_bound", "best_order_exact"]

EXACT_MAX_DEVICES = 16
EXACT_MAX_WORK = 2e8  # 2^D * D * (L-D+1)^2 element operations of the subset recursion (about a second)


def best_order_exact(costs: Sequence[np.ndarray]) -> tuple[float, list[int], list[int]]:
    """(bottleneck, order, bounds) minimising over every order of the devices; (inf, [], []) if none fits."""
    d, n = len(costs), costs[0].shape[0] - 1
    full = (1 << d) - 1
    best = np.full((1 << d, n + 1), math.inf)
    best[0, 0] = 0.0
    back_dev = np.full((1 << d, n + 1), -1, dtype=np.int64)
    back_a = np.zeros((1 << d, n + 1), dtype=np.int64)
    for mask in range(full):  # subsets in increasing order: every predecessor is done before its successors
        row = best[mask]
        if not np.isfinite(row).any():
            continue
        pos = mask.bit_count()  # the devices of `mask` fill positions 0..pos-1
        for i in range(d):
            if mask >> i & 1:
                continue
            val, arg = step(row, costs[i], pos, d)
            nxt = mask | 1 << i
            better = val < best[nxt]
            best[nxt][better] = val[better]
            back_dev[nxt][better] = i
            back_a[nxt][better] = arg[better]
    if not math.isfinite(best[full, n]):
        return math.inf, [], []
    order, bounds, mask, b = [], [n], full, n
    while mask:
        i, a = int(back_dev[mask, b]), int(back_a[mask, b])
        order.append(i)
        bounds.append(a)
        mask, b = mask & ~(1 << i), a
    return float(best[full, n]), order[::-1], bounds[::-1]


def order_lower_bound(layers: Sequence[LayerCost], devices: Sequence[DeviceProfile]) -> float:
    """A lower bound on the bottleneck of every order and partition (the largest of the bounds below).

    k slowest: the k slowest devices hold k distinct layers, so one of them holds a layer of at least the k-th
    smallest FLOPs. Count: within a bottleneck T, device k holds at most as many of the L - j largest layers as the
    smallest of them fit in (T - its link time) / time_per_flop and in its memory; the counts must reach L - j
    (j = 0..7; for j = 0 every device needs one layer; one device, the last, sends nothing). Fluid: the capacities (T - link time) /
    time_per_flop must add up to the model's FLOPs. Contiguity and order are ignored, so every order respects it.
    """
    order = np.argsort([float(x.flops) for x in layers], kind="stable")
    f = np.array([float(layers[i].flops) for i in order])
    mem = np.array([float(layers[i].memory_bytes) for i in order])
    tpf = np.array([d.time_per_flop_s for d in devices])
    cap_m = np.array([d.memory_bytes for d in devices])
    bound = float(max(t * fk for t, fk in zip(np.sort(tpf)[::-1], f)))
    bound = max(bound, float(tpf.min() * f[-1]))
    act_min = min(float(x.activation_bytes) for x in layers)
    link = np.array([d.latency_s + act_min / d.bandwidth_bytes_per_s for d in devices])
    n, total = len(layers), float(f.sum())

    def count_ok_for(drop: int):
        # only the n - drop largest layers are counted: small layers (embedding, head) would otherwise count on
        # every device at once; with drop > 0 a device may hold none of them
        cum_f = np.concatenate([[0.0], np.cumsum(f[drop:])])
        cum_m = np.concatenate([[0.0], np.cumsum(np.sort(mem[drop:]))])
        by_memory = np.searchsorted(cum_m, cap_m, side="right") - 1
        need = 1 if drop == 0 else 0

        def ok(t: float) -> bool:
            with_link = np.minimum(np.searchsorted(cum_f, (t - link) / tpf, side="right") - 1, by_memory)
            free = np.minimum(np.searchsorted(cum_f, t / tpf, side="right") - 1, by_memory)
            short = np.flatnonzero(with_link < need)
            if len(short) > 1 or (len(short) == 1 and free[short[0]] < need):
                return False
            gain = free - with_link  # the device that goes last sends nothing
            last = short[0] if len(short) else int(np.argmax(gain))
            return int(with_link.sum() + gain[last]) >= n - drop
        return ok

    def fluid_ok(t: float) -> bool:
        cap = np.maximum(0.0, t - link) / tpf
        return float(cap.sum() + (np.minimum(t, link) / tpf).max()) >= total

    hi = float(link.max() + total * tpf.max()) * (1 + 1e-12) + 1e-300
    for ok in [count_ok_for(drop) for drop in range(min(n, 8))] + [fluid_ok]:
        lo, top = 0.0, hi
        for _ in range(100):
            mid = (lo + top) / 2
            lo, top = (lo, mid) if ok(mid) else (mid, top)
        bound = max(bound, lo)  # `lo` fails the relaxation, so every real bottleneck is above it
    return bound


def _search(costs: list[np.ndarray], devices: Sequence[DeviceProfile], max_rounds: int) -> tuple[float, list[int]]:
    """Best order found from the candidate orders by bottleneck-swap local search."""
    d = len(devices)
    idx = list(range(d))
    mem = [dev.memory_bytes for dev in devices]
    tpf = [dev.time_per_flop_s for dev in devices]
    slowest = max(idx, key=lambda k: tpf[k])  # last, it sends nothing and may hold only the small head layers
    candidates = [idx, [k for k in idx if k != slowest] + [slowest], sorted(idx, key=lambda k: tpf[k]),
                  sorted(idx, key=lambda k: -tpf[k]), sorted(idx, key=lambda k: (-mem[k], tpf[k]))]
    best_t, order = math.inf, idx
    for cand in candidates:
        t, _ = min_bottleneck_matrices([costs[k] for k in cand])
        if t < best_t:
            best_t, order = t, list(cand)
    if not math.isfinite(best_t):
        return best_t, []
    for _ in range(max_rounds):
        rows = _prefix_rows(costs, order)
        _, bounds = min_bottleneck_matrices([costs[k] for k in order])
        times = [costs[order[p]][bounds[p], bounds[p + 1]] for p in range(d)]
        p = int(np.argmax(times))
        move_t, move = best_t, None
        for q in range(d):
            if q == p:
                continue
            trial = list(order)
            trial[p], trial[q] = trial[q], trial[p]
            s = min(p, q)
            t = _finish(rows[s], [costs[k] for k in trial[s:]], s)
            if t < move_t:
                move_t, move = t, trial
        if move is None:
            break
        best_t, order = move_t, move
    return best_t, order


def _prefix_rows(costs: list[np.ndarray], order: list[int]) -> list[np.ndarray]:
    """rows[s] = best bottleneck of the first s devices of `order` ending before each layer (rows[0] = start)."""
    n, d = costs[0].shape[0] - 1, len(order)
    row = np.full(n + 1, math.inf)
    row[0] = 0.0
    rows = [row]
    for pos, k in enumerate(order):
        row = step(row, costs[k], pos, d)[0]
        rows.append(row)
    return rows


def _finish(row: np.ndarray, costs: list[np.ndarray], start: int) -> float:
    d = start + len(costs)
    for pos, c in enumerate(costs, start):
        row = step(row, c, pos, d)[0]
    return float(row[-1])


@register_allocator("optimal-order")
def allocate_optimal_order(layers: Sequence[LayerCost], devices: Sequence[DeviceProfile],
                           exact: bool | None = None, max_rounds: int = 50) -> Allocation:
    """Choose order and cut points: exact when small (or `exact=True`), else search with a reported gap."""
    prob = Problem.of(layers)
    costs = [prob.cost_matrix(d) for d in devices]
    n, d = len(layers), len(devices)
    if exact is None:
        exact = d <= EXACT_MAX_DEVICES and 2.0 ** d * d * (n - d + 1) ** 2 <= EXACT_MAX_WORK
    if exact:
        t, order, bounds = best_order_exact(costs)
        lower = t
    else:
        t, order = _search(costs, devices, max_rounds)
        bounds = min_bottleneck_matrices([costs[k] for k in order])[1] if order else []
        lower = order_lower_bound(layers, devices)
    if not bounds:
        raise _no_arrangement(prob, layers, devices)
    ordered = [devices[k] for k in order]
    return evaluate("optimal-order", bounds, prob, ordered, order=order, lower_bound_s=min(lower, t),
                    notes={"exact": exact})


def _no_arrangement(prob: Problem, layers: Sequence[LayerCost], devices: Sequence[DeviceProfile]) -> AllocationError:
    total = prob.memory_bytes(0, prob.num_layers)
    have = sum(d.memory_bytes for d in devices)
    if total > have:
        return AllocationError(f"the model needs {total:.0f} bytes and all {len(devices)} devices together have "
                               f"{have:.0f}: {total - have:.0f} bytes missing; add devices or memory")
    j = max(range(len(layers)), key=lambda i: layers[i].memory_bytes)
    k = max(range(len(devices)), key=lambda i: devices[i].memory_bytes)
    if layers[j].memory_bytes > devices[k].memory_bytes:
        return AllocationError(f"layer {j} needs {layers[j].memory_bytes:.0f} bytes but the largest device "
                               f"{devices[k].label(k)} has {devices[k].memory_bytes:.0f}: "
                               f"{layers[j].memory_bytes - devices[k].memory_bytes:.0f} bytes missing")
    return AllocationError(f"no device order found whose contiguous ranges fit the memory caps (the model needs "
                           f"{total:.0f} bytes of {have:.0f}); device {devices[k].label(k)} is the largest; add memory")
