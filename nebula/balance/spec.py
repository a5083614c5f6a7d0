"""`AllocationSpec`: an allocation as a job file carries it (`allocation:`), written by `nebula allocate --write-job`.

In a job file either form works once the job schema embeds this class::

    allocation: {method: optimal, devices: [gpu0, gpu1], bounds: [0, 70, 163], bottleneck_s: 0.41}
    allocation: {method: optimal}      # no bounds: compute them at launch from measured device profiles
"""
from __future__ import annotations

from dataclasses import dataclass

from nebula.balance.base import method_names
from nebula.balance.cost import Allocation

__all__ = ["AllocationSpec", "spec_of"]


@dataclass(frozen=True, kw_only=True, slots=True)
class AllocationSpec:
    """Method, device names in pipeline order and the partition index (empty: to be computed at launch)."""

    method: str = "optimal"
    devices: tuple[str, ...] = ()
    bounds: tuple[int, ...] = ()
    bottleneck_s: float | None = None  # predicted iteration time, for the record
    stage_times_s: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.method not in method_names():
            raise ValueError(f"allocation.method={self.method!r} is unknown; known: {', '.join(method_names())}")
        if self.bounds:
            b = list(self.bounds)
            if len(b) != len(self.devices) + 1 or b[0] != 0 or any(y <= x for x, y in zip(b, b[1:])):
                raise ValueError(f"allocation.bounds={b} must be 0 = b0 < b1 < ... with one more entry than "
                                 f"allocation.devices ({len(self.devices)}); rerun nebula allocate --write-job")
        if self.stage_times_s and len(self.stage_times_s) != len(self.devices):
            raise ValueError("allocation.stage_times_s needs one entry per device; rerun nebula allocate --write-job")

    def layers_of(self, device: str) -> range:
        """Layer indices the named device holds (ValueError naming the known devices)."""
        if device not in self.devices:
            raise ValueError(f"device {device!r} is not in allocation.devices ({', '.join(self.devices)})")
        k = self.devices.index(device)
        return range(self.bounds[k], self.bounds[k + 1])


def spec_of(allocation: Allocation) -> AllocationSpec:
    """The AllocationSpec of a computed allocation (device names as `DeviceProfile.label` gives them)."""
    return AllocationSpec(method=allocation.method,
                          devices=tuple(d.label(allocation.order[k]) for k, d in enumerate(allocation.devices)),
                          bounds=tuple(allocation.bounds), bottleneck_s=float(allocation.bottleneck_s),
                          stage_times_s=tuple(float(t) for t in allocation.stage_times_s))
