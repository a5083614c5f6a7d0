"""Costs of layers and devices, the stage time model, and the `Allocation` every allocator returns.

Stage time model (the objective every allocator minimises, as the `q` of Sky Computing's MILP): device k of the
ordered list holds layers ``bounds[k] .. bounds[k+1]-1`` and its stage time is

    compute_k = time_per_flop_s[k] * sum(flops of its layers)
    comm_k    = latency_s[k] + activation_bytes[last layer] / bandwidth_bytes_per_s[k]   (0 for the last device)
    stage_k   = compute_k + comm_k

The communication term is charged to the sender: a device's latency and bandwidth describe its link to the next
device, and it sends the activation of its last layer (gradients come back over the same link, so a profile that
wants both directions counted sets `activation_bytes` to the bytes crossing per iteration). The predicted iteration
time of a pipeline is its bottleneck, ``max_k stage_k``. A device's memory holds the sum of its layers'
`memory_bytes` (parameters, gradients, optimizer state and saved activations; see `nebula.balance.profile`).
Every stage holds at least one layer, as in the paper.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

__all__ = ["LayerCost", "DeviceProfile", "Allocation", "AllocationError", "Problem", "evaluate", "check_problem"]


class AllocationError(ValueError):
    """No allocation fits the devices (the message names the device and the bytes missing), or bad allocator input."""


def _finite_nonneg(name: str, value: float, fix: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or value < 0 \
            or math.isinf(value):
        raise ValueError(f"{name}={value!r} must be a finite number >= 0; {fix}")


@dataclass(frozen=True, kw_only=False, slots=True)
class LayerCost:
    """What one layer costs: FLOPs per iteration, bytes it holds on its device, bytes of the activation it outputs."""

    flops: float
    memory_bytes: float
    activation_bytes: float = 0.0
    name: str = ""

    def __post_init__(self) -> None:
        _finite_nonneg("LayerCost.flops", self.flops, "count forward+backward FLOPs of one iteration")
        _finite_nonneg("LayerCost.memory_bytes", self.memory_bytes,
                       "give parameter+gradient+optimizer+activation bytes")
        _finite_nonneg("LayerCost.activation_bytes", self.activation_bytes, "give the bytes of the layer's output")


@dataclass(frozen=True, kw_only=False, slots=True)
class DeviceProfile:
    """What one device offers: seconds per FLOP, memory for layers, and latency/bandwidth of its link to the next.

    `memory_bytes` and `bandwidth_bytes_per_s` may be `math.inf` (no cap / free link); `name` identifies the device
    across re-allocations.
    """

    time_per_flop_s: float
    memory_bytes: float
    latency_s: float = 0.0
    bandwidth_bytes_per_s: float = math.inf
    name: str = ""

    def __post_init__(self) -> None:
        t = self.time_per_flop_s
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not (0 < t < math.inf):
            raise ValueError(f"DeviceProfile{_who(self.name)}.time_per_flop_s={t!r} must be a finite number > 0 "
                             "(seconds per FLOP: a device with speed S FLOP/s has 1/S)")
        m = self.memory_bytes
        if isinstance(m, bool) or not isinstance(m, (int, float)) or math.isnan(m) or m <= 0:
            raise ValueError(f"DeviceProfile{_who(self.name)}.memory_bytes={m!r} must be > 0 (bytes free for layers; "
                             "math.inf for no cap)")
        _finite_nonneg(f"DeviceProfile{_who(self.name)}.latency_s", self.latency_s,
                       "give the one-way latency to the next device in seconds")
        bw = self.bandwidth_bytes_per_s
        if isinstance(bw, bool) or not isinstance(bw, (int, float)) or math.isnan(bw) or bw <= 0:
            raise ValueError(f"DeviceProfile{_who(self.name)}.bandwidth_bytes_per_s={bw!r} must be > 0 "
                             "(math.inf for a free link)")

    def label(self, index: int) -> str:
        """The device's name, or `#index` when it has none."""
        return self.name or f"#{index}"


def _who(name: str) -> str:
    return f"({name!r})" if name else ""


@dataclass(frozen=True, slots=True)
class Problem:
    """Prefix sums of a layer list, shared by the allocators (pure data, built once per call)."""

    flops: np.ndarray  # prefix sums, length L+1
    memory: np.ndarray  # prefix sums, length L+1
    activation: np.ndarray  # per layer, length L

    @staticmethod
    def of(layers: Sequence[LayerCost]) -> "Problem":
        """Prefix sums of `layers`."""
        f = np.concatenate([[0.0], np.cumsum([float(x.flops) for x in layers])])
        m = np.concatenate([[0.0], np.cumsum([float(x.memory_bytes) for x in layers])])
        a = np.array([float(x.activation_bytes) for x in layers], dtype=float)
        return Problem(flops=f, memory=m, activation=a)

    @property
    def num_layers(self) -> int:
        """L."""
        return len(self.activation)

    def comm_s(self, device: DeviceProfile) -> np.ndarray:
        """Communication term of `device` when its stage ends before layer b, for b = 0..L (0 at b = L)."""
        out = np.empty(self.num_layers + 1)
        out[0] = math.inf  # a stage never ends before layer 0
        out[1:] = device.latency_s + self.activation / device.bandwidth_bytes_per_s
        out[-1] = 0.0  # the last stage sends nothing on
        return out

    def cost_matrix(self, device: DeviceProfile) -> np.ndarray:
        """C[a, b] = stage time of `device` holding layers a..b-1; inf where b <= a or memory does not fit."""
        f, m = self.flops, self.memory
        c = device.time_per_flop_s * (f[None, :] - f[:, None]) + self.comm_s(device)[None, :]
        n = len(f)
        bad = np.tri(n, n, 0, dtype=bool)  # b <= a
        if device.memory_bytes < math.inf:
            bad |= (m[None, :] - m[:, None]) > device.memory_bytes
        c[bad] = math.inf
        return c

    def stage_time_s(self, device: DeviceProfile, a: int, b: int) -> float:
        """Stage time of `device` holding layers a..b-1 (same arithmetic as `cost_matrix`, so results match bitwise)."""
        comm = 0.0 if b == self.num_layers else device.latency_s + self.activation[b - 1] / device.bandwidth_bytes_per_s
        return float(device.time_per_flop_s * (self.flops[b] - self.flops[a]) + comm)

    def memory_bytes(self, a: int, b: int) -> float:
        """Bytes layers a..b-1 hold."""
        return float(self.memory[b] - self.memory[a])


@dataclass(frozen=True, slots=True)
class Allocation:
    """A partition of layers onto an ordered list of devices, with its predicted stage times.

    `bounds` has length D+1: device k (of `devices`, in this order) holds layers ``bounds[k] .. bounds[k+1]-1``.
    `order[k]` is the index of that device in the list the caller passed (identity unless the method reorders).
    `lower_bound_s` is a proven lower bound on the best bottleneck the method knows (equal to `bottleneck_s`
    when the method proved it optimal).
    """

    method: str
    bounds: tuple[int, ...]
    stage_times_s: tuple[float, ...]
    bottleneck_s: float
    memory_used_bytes: tuple[float, ...]
    devices: tuple[DeviceProfile, ...]
    order: tuple[int, ...]
    lower_bound_s: float | None = None
    notes: dict = field(default_factory=dict)

    @property
    def num_devices(self) -> int:
        """D."""
        return len(self.devices)

    def layers_of(self, k: int) -> range:
        """Layer indices device k holds."""
        return range(self.bounds[k], self.bounds[k + 1])

    @property
    def num_layers_per_device(self) -> tuple[int, ...]:
        """Layers per device, in device order."""
        return tuple(b - a for a, b in zip(self.bounds, self.bounds[1:]))

    @property
    def gap(self) -> float | None:
        """Relative gap of the bottleneck to the lower bound (0.0 = proven optimal), None without a bound."""
        if self.lower_bound_s is None:
            return None
        return (self.bottleneck_s - self.lower_bound_s) / self.lower_bound_s if self.lower_bound_s > 0 else 0.0

    def rows(self) -> list[dict]:
        """One dict per device: name, layers, predicted time, memory used and limit (for tables and job files)."""
        out = []
        for k, d in enumerate(self.devices):
            out.append({"device": d.label(self.order[k]), "first_layer": self.bounds[k],
                        "last_layer": self.bounds[k + 1] - 1, "num_layers": self.bounds[k + 1] - self.bounds[k],
                        "time_s": self.stage_times_s[k], "memory_bytes": self.memory_used_bytes[k],
                        "memory_limit_bytes": d.memory_bytes})
        return out


def check_problem(layers: Sequence[LayerCost], devices: Sequence[DeviceProfile]) -> None:
    """Raise AllocationError for input no method can allocate (types, empty lists, fewer layers than devices)."""
    if not layers:
        raise AllocationError("no layers to allocate; profile the model first (nebula.balance.profile)")
    if not devices:
        raise AllocationError("no devices to allocate onto; list at least one DeviceProfile")
    for i, x in enumerate(layers):
        if not isinstance(x, LayerCost):
            raise AllocationError(f"layers[{i}] is {type(x).__name__}, expected LayerCost(flops, memory_bytes, "
                                  "activation_bytes)")
    for i, d in enumerate(devices):
        if not isinstance(d, DeviceProfile):
            raise AllocationError(f"devices[{i}] is {type(d).__name__}, expected DeviceProfile(time_per_flop_s, "
                                  "memory_bytes, latency_s, bandwidth_bytes_per_s)")
    if len(layers) < len(devices):
        raise AllocationError(f"{len(layers)} layers cannot be split over {len(devices)} devices (every device holds "
                              f"at least one layer); use at most {len(layers)} devices or split the model finer")
    names = [d.name for d in devices if d.name]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise AllocationError(f"device name {dup[0]!r} is used twice; give every device a distinct name")


def evaluate(method: str, bounds: Sequence[int], layers: Sequence[LayerCost] | Problem,
             devices: Sequence[DeviceProfile], order: Sequence[int] | None = None,
             lower_bound_s: float | None = None, notes: dict | None = None) -> Allocation:
    """The Allocation of `bounds` over `devices` (in allocation order); AllocationError on a bad partition."""
    prob = layers if isinstance(layers, Problem) else Problem.of(layers)
    bounds = tuple(int(b) for b in bounds)
    d, n = len(devices), prob.num_layers
    if len(bounds) != d + 1 or bounds[0] != 0 or bounds[-1] != n or any(b <= a for a, b in zip(bounds, bounds[1:])):
        raise AllocationError(f"partition index {list(bounds)} is not 0 = b0 < b1 < ... < b{d} = {n}; every device "
                              "needs at least one layer")
    times, used = [], []
    for k, dev in enumerate(devices):
        a, b = bounds[k], bounds[k + 1]
        times.append(prob.stage_time_s(dev, a, b))
        used.append(prob.memory_bytes(a, b))
    for k, dev in enumerate(devices):
        if used[k] > dev.memory_bytes:
            missing = used[k] - dev.memory_bytes
            raise AllocationError(f"device {dev.label(k)} would hold layers {bounds[k]}..{bounds[k + 1] - 1} "
                                  f"({used[k]:.0f} bytes) but has {dev.memory_bytes:.0f}: {missing:.0f} bytes "
                                  "missing; give it fewer layers (method 'optimal') or more memory")
    return Allocation(method=method, bounds=bounds, stage_times_s=tuple(times), bottleneck_s=max(times),
                      memory_used_bytes=tuple(used), devices=tuple(devices),
                      order=tuple(order) if order is not None else tuple(range(d)),
                      lower_bound_s=lower_bound_s, notes=dict(notes or {}))
