"""Re-allocation when devices join or leave: the optimal bottleneck, moving as few layer bytes as possible.

Devices are matched by `DeviceProfile.name` between the old and the new allocation. First the method finds the best
bottleneck T* for the new device list (`optimal`: in the given order; `optimal-order`: it also picks the order,
which is then kept). Then a second dynamic program over the same stage-time matrices keeps, among all partitions
whose every stage time is at most T* x (1 + tolerance), one that keeps the most bytes in place:
``kept[k][b] = max_a kept[k-1][a] + bytes of layers a..b-1 device k already holds``. Every other layer moves (from
its old device, or from the checkpoint when that device left). Both programs are O(D * L^2), milliseconds here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

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


def min_move_bounds(prob: Problem, devices: Sequence[DeviceProfile], owner: Sequence[str | None],
                    cap_s: float) -> list[int]:
    """Partition index with every stage time <= cap_s that keeps the most bytes on their current device; [] if none."""
    n, d = prob.num_layers, len(devices)
    mem = prob.memory
    kept = np.full(n + 1, -math.inf)
    kept[0] = 0.0
    backs = []
    for pos, dev in enumerate(devices):
        held = [j for j in range(n) if owner[j] == dev.name]
        lo, hi = pos, n - d + pos  # starts that leave a layer for every device (as in optimal.step)
        a = np.arange(lo, hi + 1)[:, None]
        b = np.arange(lo + 1, hi + 2)[None, :]
        if held:
            p, q = held[0], held[-1] + 1  # a device's old layers are one contiguous range
            top, bottom = np.minimum(b, q), np.maximum(a, p)
            overlap = np.where(top > bottom, mem[top] - mem[bottom], 0.0)
        else:
            overlap = np.zeros((len(a), b.shape[1]))
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
               method: str = "optimal", tolerance: float = 0.0) -> Reallocation:
    """Re-plan `layers` onto `devices` (some new, some gone) with `method`'s bottleneck, moving the fewest bytes.

    `tolerance` lets the bottleneck exceed the method's optimum by that fraction when that saves moves.
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
    owner: list[str | None] = [None] * len(layers)
    for k, dev in enumerate(previous.devices):
        for j in previous.layers_of(k):
            owner[j] = dev.name
    fresh = allocate(layers, devices, method)
    target = fresh.bottleneck_s
    alloc = fresh
    if method in ("optimal", "optimal-order"):
        prob = Problem.of(layers)
        ordered = list(fresh.devices)
        bounds = min_move_bounds(prob, ordered, owner, target * (1.0 + tolerance))
        if bounds:  # always found: the fresh allocation itself is within the cap
            alloc = evaluate(method, bounds, prob, ordered, order=fresh.order,
                             lower_bound_s=fresh.lower_bound_s, notes=dict(fresh.notes))
    present = {d.name for d in devices}
    moves: list[LayerMove] = []
    for k, dev in enumerate(alloc.devices):
        for j in alloc.layers_of(k):
            if owner[j] == dev.name:
                continue
            src = owner[j] if owner[j] in present else None
            nbytes = float(layers[j].memory_bytes)
            last = moves[-1] if moves else None
            if last and last.dst == dev.name and last.src == src and last.last_layer == j - 1:
                moves[-1] = LayerMove(last.first_layer, j, src, dev.name, last.bytes + nbytes)
            else:
                moves.append(LayerMove(j, j, src, dev.name, nbytes))
    return Reallocation(allocation=alloc, moves=tuple(moves), moved_bytes=sum(m.bytes for m in moves),
                        optimal_bottleneck_s=target)
