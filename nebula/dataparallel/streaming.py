"""Streaming DiLoCo's schedule (pure numpy): which slice of the model each step sends and when its result merges.

The model's values, in parameter (layer) order, are one flat float32 vector cut into F equal slices
(`np.linspace(0, n, F + 1).round()`). With H = `sync_every`, slice f is sent after every step s with
(s + 1) % H == ((f + 1) * H // F) % H, so one F-th of the model crosses the WAN at a time, spread evenly over the
interval; the outer result of a slice sent after step s merges into the replica after step s + `delay` (the send
overlaps those inner steps). After the last step every slice is sent and the replicas end as the agreed model.
`nebula.quality.engine` simulates the same schedule in one process.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

__all__ = ["Fragments", "flatten_f32", "unflatten_f32", "merge"]


@dataclass(frozen=True)
class Fragments:
    """The slices of a model of `size` values and their schedule (`fragments` F, `sync_every` H, `delay` tau)."""

    size: int
    fragments: int
    sync_every: int
    delay: int = 0

    def __post_init__(self) -> None:
        if self.size < self.fragments or not 1 <= self.fragments <= self.sync_every:
            raise ValueError(f"streaming: fragments={self.fragments} must be from 1 to sync_every ({self.sync_every}) "
                             f"and at most the model's {self.size} values")
        if not 0 <= self.delay < self.sync_every:
            raise ValueError(f"streaming: delay={self.delay} must be from 0 to sync_every - 1 ({self.sync_every - 1})")

    @property
    def cuts(self) -> np.ndarray:
        """F + 1 offsets into the flat model: slice f is [cuts[f], cuts[f + 1])."""
        return np.linspace(0, self.size, self.fragments + 1).round().astype(np.int64)

    def bounds(self, f: int) -> tuple[int, int]:
        c = self.cuts
        return int(c[f]), int(c[f + 1])

    def offset(self, f: int) -> int:
        """The step count (mod H) after which slice f is sent."""
        return (f + 1) * self.sync_every // self.fragments % self.sync_every

    def sends(self, done: int, steps: int) -> list[int]:
        """The slices sent after `done` steps of a run of `steps` (every slice after the last)."""
        if done >= steps:
            return list(range(self.fragments))
        return [f for f in range(self.fragments) if done % self.sync_every == self.offset(f)]

    def peak_fraction(self) -> float:
        """The largest share of the model one step sends (outside the last step)."""
        c = self.cuts
        return float(np.max(np.diff(c))) / self.size


def flatten_f32(tensors: Mapping[str, np.ndarray]) -> np.ndarray:
    """Every value of `tensors`, in their order, as one float32 vector (the fragments' model; secure aggregation's
    `secagg.flatten` keeps float64 in an agreed order instead, for its fixed-point sums)."""
    return np.concatenate([np.asarray(v, np.float32).reshape(-1) for v in tensors.values()])


def unflatten_f32(flat: np.ndarray, like: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`flat` cut back into tensors shaped (and typed) as `like`."""
    if flat.size != sum(int(np.size(v)) for v in like.values()):
        raise ValueError(f"flat model of {flat.size} values does not fit tensors of "
                         f"{sum(int(np.size(v)) for v in like.values())}")
    out, at = {}, 0
    for k, v in like.items():
        n = int(np.size(v))
        out[k] = flat[at:at + n].reshape(np.shape(v)).astype(np.asarray(v).dtype, copy=True)
        at += n
    return out


def merge(replica: np.ndarray, outer: np.ndarray, alpha: float) -> np.ndarray:
    """A delayed outer result merged into the replica's slice: alpha * replica + (1 - alpha) * outer (alpha 0:
    the outer result itself, exactly)."""
    if alpha == 0.0:
        return np.array(outer, dtype=np.float32)
    return (alpha * replica + (1 - alpha) * outer).astype(np.float32, copy=False)
