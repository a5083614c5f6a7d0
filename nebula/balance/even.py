"""`even`: the naive baseline of Sky Computing §IV-A, the same number of layers on every device."""
from __future__ import annotations

from typing import Sequence

from nebula.balance.base import register_allocator
from nebula.balance.cost import Allocation, DeviceProfile, LayerCost, evaluate

__all__ = ["even_bounds", "allocate_even"]


def even_bounds(num_layers: int, num_devices: int) -> list[int]:
    """Partition index with equal layer counts; the first `num_layers % num_devices` devices get one more."""
    q, r = divmod(num_layers, num_devices)
    bounds = [0]
    for k in range(num_devices):
        bounds.append(bounds[-1] + q + (1 if k < r else 0))
    return bounds


@register_allocator("even")
def allocate_even(layers: Sequence[LayerCost], devices: Sequence[DeviceProfile]) -> Allocation:
    """Equal layer counts, blind to speed; AllocationError if that overflows a device's memory."""
    return evaluate("even", even_bounds(len(layers), len(devices)), layers, devices)
