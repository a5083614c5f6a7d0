"""Slowdown simulator: emulate slower devices and links on uniform hardware, as Sky Computing §V-B does.

One component serves the benchmark (it turns a measured device into the profile of a slower one) and real runs
(a rank sleeps the extra compute time after its forward and backward passes, and a shaped link sleeps latency plus
bytes / bandwidth per message). The paper sleeps ``slow_down x measured time`` (so slow_down = 1 doubles the time);
here `compute` is the factor on the measured time itself, ``total = compute x measured``, so compute = 1 is the
real device and the paper's slow_down s is compute = 1 + s. Factors are drawn as in the paper's §VI-D: normal,
clipped to [1, 7] (`draw_factors`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import numpy as np

from nebula.balance.cost import DeviceProfile

__all__ = ["LinkShape", "Slowdown", "draw_factors", "draw_slowdowns", "slowed_device"]


@dataclass(frozen=True, kw_only=True, slots=True)
class LinkShape:
    """A link to emulate: one-way latency plus transfer at a bandwidth (defaults: the real link, unshaped)."""

    latency_s: float = 0.0
    bandwidth_bytes_per_s: float = math.inf

    def __post_init__(self) -> None:
        if not (0 <= self.latency_s < math.inf):
            raise ValueError(f"link latency_s={self.latency_s!r} must be a finite number >= 0 (seconds)")
        if not self.bandwidth_bytes_per_s > 0:
            raise ValueError(f"link bandwidth_bytes_per_s={self.bandwidth_bytes_per_s!r} must be > 0 "
                             "(omit it for an unshaped link)")

    def delay_s(self, nbytes: float) -> float:
        """Seconds a message of `nbytes` takes on this link beyond the real one."""
        return self.latency_s + nbytes / self.bandwidth_bytes_per_s

    def apply(self, nbytes: float) -> float:
        """Sleep for `delay_s(nbytes)` (call it beside each send); returns the seconds slept."""
        d = self.delay_s(nbytes)
        if d > 0:
            time.sleep(d)
        return d


@dataclass(frozen=True, kw_only=True, slots=True)
class Slowdown:
    """Per-rank emulation: compute time multiplied by `compute` (>= 1), sends shaped by `link` to the next rank."""

    compute: float = 1.0
    link: LinkShape = field(default_factory=LinkShape)

    def __post_init__(self) -> None:
        if isinstance(self.compute, bool) or not (1.0 <= self.compute < math.inf):
            raise ValueError(f"slowdown compute={self.compute!r} must be a finite factor >= 1 (1 = the real speed, "
                             "3 = three times slower)")

    def extra_compute_s(self, seconds: float) -> float:
        """Extra seconds to add after `seconds` of real compute."""
        return (self.compute - 1.0) * max(seconds, 0.0)

    def apply_compute(self, seconds: float) -> float:
        """Sleep the extra time for `seconds` of real compute just done; returns the seconds slept."""
        extra = self.extra_compute_s(seconds)
        if extra > 0:
            time.sleep(extra)
        return extra

    @contextlib.contextmanager
    def compute_block(self) -> Iterator[None]:
        """Time the enclosed compute (a forward or a backward pass) and then sleep its extra time."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.apply_compute(time.perf_counter() - start)

    def apply_link(self, nbytes: float) -> float:
        """Sleep as the shaped link would take for a message of `nbytes`; returns the seconds slept."""
        return self.link.apply(nbytes)

    def device(self, base: DeviceProfile) -> DeviceProfile:
        """The profile of `base` under this slowdown: slower per FLOP, plus the emulated link's latency and rate."""
        inv = 1.0 / base.bandwidth_bytes_per_s + 1.0 / self.link.bandwidth_bytes_per_s  # the two in series
        bw = 1.0 / inv if inv > 0 else math.inf
        return dataclasses.replace(base, time_per_flop_s=base.time_per_flop_s * self.compute,
                                   latency_s=base.latency_s + self.link.latency_s, bandwidth_bytes_per_s=bw)


def draw_factors(num: int, seed: int, mean: float = 4.0, std: float = 2.0, low: float = 1.0,
                 high: float = 7.0) -> list[float]:
    """`num` reproducible compute factors: normal(mean, std) clipped to [low, high] (the paper's 1-7 range)."""
    rng = np.random.default_rng(seed)
    return [float(x) for x in np.clip(rng.normal(mean, std, size=num), low, high)]


def draw_slowdowns(num: int, seed: int, links: Sequence[LinkShape] | None = None, **kwargs) -> list[Slowdown]:
    """`num` Slowdowns with factors from `draw_factors` (kwargs go there) and optional per-rank links."""
    factors = draw_factors(num, seed, **kwargs)
    links = list(links) if links is not None else [LinkShape()] * num
    if len(links) != num:
        raise ValueError(f"got {len(links)} links for {num} ranks; give one LinkShape per rank (or none)")
    return [Slowdown(compute=f, link=lk) for f, lk in zip(factors, links)]


def slowed_device(base: DeviceProfile, slowdown: Slowdown, memory_bytes: float | None = None,
                  name: str | None = None) -> DeviceProfile:
    """`slowdown.device(base)` with an optional memory limit and name of its own."""
    dev = slowdown.device(base)
    changes = {}
    if memory_bytes is not None:
        changes["memory_bytes"] = memory_bytes
    if name is not None:
        changes["name"] = name
    return dataclasses.replace(dev, **changes) if changes else dev
