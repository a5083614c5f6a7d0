"""The `fedoptima:` block of a federated job file (all keys optional; defaults documented here).

Example::

    fedoptima:
      omega: 8                 # cap on activation batches the server holds or has granted, over all devices
      split: null              # layers kept on the device; null: the pre-processor picks it
      local_iterations: 5      # H: device iterations between model uploads
      max_rounds: 10           # E: global rounds (K aggregations each)
      duration_s: 60           # ... or stop after this much wall time, whichever comes first
      alpha: 0.6               # FedAsync mixing weight, scaled by the staleness function
      staleness: polynomial    # constant | polynomial | hinge
      max_delay: 8             # D: device models staler than this many versions are not aggregated
      slowdown: [1, 1, 4, 4]   # per-device compute slowdown factors (heterogeneous devices on one machine)
      bandwidth_bytes_per_s: 6.25e6  # devices' upload rate, for the pre-processor's split rule
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from nebula.federated.strategies.fedasync import STALENESS

__all__ = ["FedOptimaSpec"]


@dataclass(frozen=True, kw_only=True, slots=True)
class FedOptimaSpec:
    """FedOptima's options: flow control, split, rounds, aggregation, timeouts and simulated slowdowns."""

    omega: int = 8
    split: Optional[int] = None
    local_iterations: int = 5
    max_rounds: int = 10
    duration_s: float = 60.0
    lr_device: float = 0.05
    lr_server: float = 0.05
    alpha: float = 0.6
    staleness: str = "polynomial"
    max_delay: int = 8
    join_timeout_s: float = 30.0  # devices that have not said hello by then are left out
    grant_timeout_s: float = 30.0  # a grant not answered by then is withdrawn and its slot freed
    idle_timeout_s: float = 30.0  # the server ends the run when no device sent anything for this long
    global_timeout_s: float = 30.0  # a device waits this long for the aggregated model, then trains on
    slowdown: tuple[float, ...] = ()
    bandwidth_bytes_per_s: float = 6.25e6  # a device's upload rate for the split rule (50 Mbit/s, as Testbed A)

    def __post_init__(self) -> None:
        if isinstance(self.omega, bool) or not isinstance(self.omega, int) or self.omega <= 0:
            raise ValueError(f"fedoptima.omega={self.omega!r} must be a positive integer (the cap on activation "
                             "batches the server holds); 0 or less would never let a device send")
        if self.split is not None and (not isinstance(self.split, int) or self.split < 1):
            raise ValueError(f"fedoptima.split={self.split!r} must be a layer count >= 1 or null (let the "
                             "pre-processor choose)")
        for name in ("local_iterations", "max_rounds"):
            if getattr(self, name) < 1:
                raise ValueError(f"fedoptima.{name}={getattr(self, name)!r} must be >= 1")
        for name in ("bandwidth_bytes_per_s", "duration_s", "lr_device", "lr_server", "join_timeout_s",
                     "grant_timeout_s", "idle_timeout_s",
                     "global_timeout_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"fedoptima.{name}={v!r} must be a positive number")
        if not 0 < self.alpha <= 1:
            raise ValueError(f"fedoptima.alpha={self.alpha!r} must be in (0, 1]")
        if self.staleness not in STALENESS:
            raise ValueError(f"fedoptima.staleness={self.staleness!r} must be one of {', '.join(STALENESS)}")
        if self.max_delay < 0:
            raise ValueError(f"fedoptima.max_delay={self.max_delay!r} must be >= 0")
        if any(not (isinstance(f, (int, float)) and f >= 1) for f in self.slowdown):
            raise ValueError(f"fedoptima.slowdown={list(self.slowdown)} must be factors >= 1 (1 = full speed)")

    def slowdown_of(self, device: int) -> float:
        """Compute slowdown of device `device` (1 when the list does not name it)."""
        return float(self.slowdown[device]) if device < len(self.slowdown) else 1.0
