"""An allocation as a job file carries it (`allocation:`, nebula.config.job.AllocationSpec), for `--write-job`."""
from __future__ import annotations

from nebula.balance.cost import Allocation
from nebula.config.job import AllocationSpec

__all__ = ["AllocationSpec", "spec_of"]


def spec_of(allocation: Allocation) -> AllocationSpec:
    """The job file's AllocationSpec of a computed allocation (device names as `DeviceProfile.label` gives them)."""
    return AllocationSpec(method=allocation.method,
                          devices=tuple(d.label(allocation.order[k]) for k, d in enumerate(allocation.devices)),
                          bounds=tuple(allocation.bounds), bottleneck_s=float(allocation.bottleneck_s),
                          stage_times_s=tuple(float(t) for t in allocation.stage_times_s))
