"""Allocator registry and `allocate(layers, devices, method)`, the one entry point of `nebula.balance`."""
from __future__ import annotations

from typing import Callable, Sequence

from nebula.registry import Registry
from nebula.balance.cost import Allocation, AllocationError, DeviceProfile, LayerCost, Problem, check_problem

__all__ = ["Allocator", "register_allocator", "allocate", "method_names", "memory_shortfall", "require_fit"]

# allocate(layers, devices, **options) -> Allocation, inputs already checked
Allocator = Callable[..., Allocation]

# allocators register on import; their modules load on first use (milp pulls in scipy)
ALLOCATORS: Registry[Allocator] = Registry(
    "allocation method", known="methods",
    lazy={"even": "nebula.balance.even", "sky": "nebula.balance.sky", "optimal": "nebula.balance.optimal",
          "optimal-order": "nebula.balance.optimal_order", "milp": "nebula.balance.milp"})


def register_allocator(name: str) -> Callable[[Allocator], Allocator]:
    """Decorator: make an allocator function available to `allocate` under `name`."""
    return ALLOCATORS.register(name)


def method_names() -> list[str]:
    """Names `allocate` accepts."""
    return ALLOCATORS.names()


def allocate(layers: Sequence[LayerCost], devices: Sequence[DeviceProfile], method: str = "optimal",
             **options) -> Allocation:
    """Allocate contiguous layer ranges to `devices` with `method`; AllocationError when nothing fits."""
    fn = ALLOCATORS.get(method)
    check_problem(layers, devices)
    return fn(list(layers), list(devices), **options)


def memory_shortfall(prob: Problem, devices: Sequence[DeviceProfile]) -> AllocationError | None:
    """None when some partition in this device order fits every memory cap, else an error naming device and bytes.

    Packing each device as full as its memory allows (leaving one layer for each later device) reaches at least as
    far as any feasible partition, so the first device it cannot serve is the one short of memory.
    """
    n, d = prob.num_layers, len(devices)
    pos = 0
    for k, dev in enumerate(devices):
        limit = n - (d - 1 - k)  # leave one layer per later device
        if k == d - 1:
            need = prob.memory_bytes(pos, n)
            if need > dev.memory_bytes:
                return AllocationError(
                    f"device {dev.label(k)} (last of {d}) must hold layers {pos}..{n - 1} ({need:.0f} bytes) but has "
                    f"{dev.memory_bytes:.0f}: {need - dev.memory_bytes:.0f} bytes missing even with every earlier "
                    "device full; add memory or devices, or shrink the model (smaller batch, fewer optimizer states)")
            return None
        first = prob.memory_bytes(pos, pos + 1)
        if first > dev.memory_bytes:
            return AllocationError(
                f"device {dev.label(k)} cannot hold even one layer (layer {pos} needs {first:.0f} bytes, it has "
                f"{dev.memory_bytes:.0f}): {first - dev.memory_bytes:.0f} bytes missing; give it more memory, drop it, "
                "or try method 'optimal-order'")
        b = pos + 1
        while b < limit and prob.memory_bytes(pos, b + 1) <= dev.memory_bytes:
            b += 1
        pos = b
    return None  # unreachable: the last device returns


def require_fit(prob: Problem, devices: Sequence[DeviceProfile]) -> None:
    """Raise the memory shortfall error of this device order, if any."""
    err = memory_shortfall(prob, devices)
    if err is not None:
        raise err

