"""Load-balanced layer allocation across heterogeneous devices (Sky Computing, made exact where it is heuristic).

`allocate(layers, devices, method)` gives each device of an ordered list one contiguous range of layers and
predicts each stage's time (see `nebula.balance.cost` for the time model). Methods: `even`, `sky` (the paper's
Algorithms 1 and 2), `optimal` (exact for the given order), `optimal-order` (also picks the order), `milp`
(scipy HiGHS, for verification). `reallocate` re-plans when devices join or leave, moving as few layer bytes as
possible. Layer costs come from `nebula.balance.profile` (real Paddle layers, or analytic BERT-style models);
`nebula.balance.simulate` emulates slow devices and links.
"""
from nebula.balance.base import allocate, method_names, register_allocator
from nebula.balance.cost import Allocation, AllocationError, DeviceProfile, LayerCost, evaluate
from nebula.balance.reallocate import LayerMove, Reallocation, reallocate
from nebula.balance.simulate import LinkShape, Slowdown, draw_factors, draw_slowdowns
from nebula.balance.spec import AllocationSpec, spec_of

__all__ = [
    "LayerCost",
    "DeviceProfile",
    "Allocation",
    "AllocationError",
    "allocate",
    "evaluate",
    "method_names",
    "register_allocator",
    "reallocate",
    "Reallocation",
    "LayerMove",
    "Slowdown",
    "LinkShape",
    "draw_factors",
    "draw_slowdowns",
    "AllocationSpec",
    "spec_of",
]
