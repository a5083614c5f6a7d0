"""Re-allocation when devices join or leave: the optimal bottleneck, moving as few layer bytes as possible.

Devices are matched by `DeviceProfile.name` between the old and the new allocation (or the caller says which layer
ranges each new device already holds: `held`, e.g. a pipeline stage whose replicas each hold a range). First the
method finds the best
bottleneck T* for the new device list (`optimal`: in the given order; `optimal-order`: it also picks the order,
which is then kept). Then a second dynamic program over the same stage-time matrices keeps, among all partitions
whose every stage time is at most T* x (1 + tolerance), one that keeps the most bytes in place:
``kept[k][b] = max_a kept[k-1][a] + bytes of layers a..b-1 device k already holds`` (summed over its held ranges).
Every other layer moves (from a device that holds it, or from the checkpoint when none does). Both programs are O(D * L^2), milliseconds here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from nebula.balance.base import allocate
from nebula.balance.cost import Allocation, AllocationError, DeviceProfile, LayerCost, Problem, evaluate

__all__ = ["LayerMove", "Reallocation", "reallocate", "min_move_bounds"]


@dataclass(frozen=True, slots=True)
class LayerMove:
    """Layers first..last change device: from `src` (None: its device left, load them from the checkpoint) to `dst`."""

    first_layer: int
    last_layer: int
    src: str | None
    dst: str
    bytes: float


@dataclass(frozen=True, slots=True)
class Reallocation:
    """The new allocation, the moves that reach it from the old one, and the bytes they move."""

    allocation: Allocation
    moves: tuple[LayerMove, ...]
    moved_bytes: float
    optimal_bottleneck_s: float  # T*: the best bottleneck of the method for the new devices


def min_move_bounds(prob: Problem, devices: Sequence[DeviceProfile], held: Mapping[str, Sequence[tuple[int, int]]],
                    cap_s: float) -> list[int]:
    """Partition index with every stage time <= cap_s that keeps the most bytes where they are; [] if none.

    `held[name]`: the layer ranges [first, stop) the device of that name already holds (one per copy)."""
    n, d = prob.num_layers, len(devices)
    mem = prob.memory
    kept = np.full(n + 1, -math.inf)
    kept[0] = 0.0
    backs = []
    for pos, dev in enumerate(devices):
        lo, hi = pos, n - d + pos  # starts that leave a layer for every device (as in optimal.step)
        a = np.arange(lo, hi + 1)[:, None]
        b = np.arange(lo + 1, hi + 2)[None, :]
        overlap = np.zeros((len(a), b.shape[1]))
        for p, q in held.get(dev.name, ()):
            top, bottom = np.minimum(b, q), np.maximum(a, p)
            overlap = overlap + np.where(top > bottom, mem[top] - mem[bottom], 0.0)
        ok = prob.cost_matrix(dev)[lo:hi + 1, lo + 1:hi + 2] <= cap_s
        val = np.where(ok, kept[lo:hi + 1, None] + overlap, -math.inf)
        arg = np.argmax(val, axis=0)
        new = np.full(n + 1, -math.inf)
        new[lo + 1:hi + 2] = val[arg, np.arange(val.shape[1])]
        back = np.zeros(n + 1, dtype=np.int64)
        back[lo + 1:hi + 2] = arg + lo
        kept = new
        backs.append(back)
    if not math.isfinite(kept[n]):
        return []
    bounds = [n]
    for k in range(d - 1, -1, -1):
        bounds.append(int(backs[k][bounds[-1]]))
    return bounds[::-1]


def reallocate(previous: Allocation, layers: Sequence[LayerCost], devices: Sequence[DeviceProfile],
               method: str = "optimal", tolerance: float = 0.0,
               held: Mapping[str, Sequence[tuple[int, int]]] | None = None) -> Reallocation:
    """Re-plan `layers` onto `devices` (some new, some gone) with `method`'s bottleneck, moving the fewest bytes.

    `tolerance` lets the bottleneck exceed the method's optimum by that fraction when that saves moves.
    `held` maps a device name to the layer ranges [first, stop) it holds now, one per copy (default: its range in
    `previous`; an empty range (p, p) for a copy that holds nothing); a layer a copy lacks moves once for it.
    For methods other than `optimal` and `optimal-order` the method's own allocation is kept and only its moves
    are reported.
    """
    if tolerance < 0 or not math.isfinite(tolerance):
        raise ValueError(f"tolerance={tolerance!r} must be a finite fraction >= 0 (0.05 allows 5% above optimal)")
    if previous.bounds[-1] != len(layers):
        raise AllocationError(f"the previous allocation covers {previous.bounds[-1]} layers, the model has "
                              f"{len(layers)}; re-allocation keeps the model, allocate afresh for a new one")
    for label, devs in (("previous allocation", previous.devices), ("new device list", devices)):
        if any(not d.name for d in devs):
            raise AllocationError(f"every device of the {label} needs a name so that re-allocation can tell which "
                                  "layers stay where; set DeviceProfile.name")
    if held is None:
        held = {dev.name: [(previous.bounds[k], previous.bounds[k + 1])] for k, dev in enumerate(previous.devices)}
    for name, ranges in held.items():
        if any(not 0 <= p <= q <= len(layers) for p, q in ranges):
            raise AllocationError(f"held[{name!r}]={list(ranges)} must be ranges (first, stop) with 0 <= first <= "
                                  f"stop <= {len(layers)} (the model's layers; first = stop for a copy holding none)")
    present = {d.name for d in devices}
    holders: list[list[str]] = [[] for _ in layers]  # which present devices hold each layer now
    for name, ranges in held.items():
        if name in present:
            for p, q in ranges:
                for j in range(p, q):
                    holders[j].append(name)
    fresh = allocate(layers, devices, method)
    target = fresh.bottleneck_s
    alloc = fresh
    if method in ("optimal", "optimal-order"):
        prob = Problem.of(layers)
        ordered = list(fresh.devices)
        bounds = min_move_bounds(prob, ordered, held, target * (1.0 + tolerance))
        if bounds:  # always found: the fresh allocation itself is within the cap
            alloc = evaluate(method, bounds, prob, ordered, order=fresh.order,
                             lower_bound_s=fresh.lower_bound_s, notes=dict(fresh.notes))
    moves: list[LayerMove] = []
    for k, dev in enumerate(alloc.devices):
        ranges = held.get(dev.name, ())
        copies = max(len(ranges), 1)  # a new device is one copy
        for j in alloc.layers_of(k):
            missing = copies - sum(p <= j < q for p, q in ranges)
            if missing == 0:
                continue
            others = [h for h in holders[j] if h != dev.name]
            src = others[0] if others else None
            nbytes = missing * float(layers[j].memory_bytes)
            last = moves[-1] if moves else None
            if last and last.dst == dev.name and last.src == src and last.last_layer == j - 1:
                moves[-1] = LayerMove(last.first_layer, j, src, dev.name, last.bytes + nbytes)
            else:
                moves.append(LayerMove(j, j, src, dev.name, nbytes))
    return Reallocation(allocation=alloc, moves=tuple(moves), moved_bytes=sum(m.bytes for m in moves),
                        optimal_bottleneck_s=target)
