"""`devices.yaml`: the device list `nebula allocate` reads, loaded through nebula.config's schema checks.

Example::

    devices:
      - {name: gpu0, flops_per_s: 1.0e+13, memory_bytes: 16.0e+9, latency_s: 0.001, bandwidth_bytes_per_s: 1.25e+9}
      - {name: gpu1, time_per_flop_s: 2.0e-13, memory_bytes: 8.0e+9, slowdown: 3}   # an emulated slower device

Numbers may be written as YAML reads them (``1.0e+13``) or as plain strings such as ``1e13``. Give each device
either `flops_per_s` or `time_per_flop_s`; `slowdown` multiplies the time per FLOP (default 1); `latency_s`
(default 0) and `bandwidth_bytes_per_s` (default unlimited) describe the link to the next device; `memory_bytes`
(default unlimited) is what the device can give to layers.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from nebula.balance.cost import DeviceProfile

__all__ = ["DeviceSpec", "DevicesFile", "load_devices"]


def _number(name: str, value: float | str | None, default: float | None) -> float | None:
    if value is None:
        return default
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            raise ValueError(f"{name}={value!r} is not a number; write e.g. 1.0e+9 or 1e9") from None
    return float(value)


@dataclass(frozen=True, kw_only=True, slots=True)
class DeviceSpec:
    """One device of devices.yaml (see the module docstring for the keys and defaults)."""

    name: str
    flops_per_s: float | str | None = None
    time_per_flop_s: float | str | None = None
    memory_bytes: float | str | None = None  # None: no cap
    latency_s: float | str = 0.0
    bandwidth_bytes_per_s: float | str | None = None  # None: unlimited
    slowdown: float | str = 1.0

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("device name is empty; give every device a distinct name")
        for f in ("flops_per_s", "time_per_flop_s", "memory_bytes", "latency_s", "bandwidth_bytes_per_s",
                  "slowdown"):
            object.__setattr__(self, f, _number(f"device {self.name}: {f}", getattr(self, f), None))
        if (self.flops_per_s is None) == (self.time_per_flop_s is None):
            raise ValueError(f"device {self.name}: give exactly one of flops_per_s or time_per_flop_s")
        if self.flops_per_s is not None and not self.flops_per_s > 0:
            raise ValueError(f"device {self.name}: flops_per_s={self.flops_per_s} must be > 0")
        if not (self.slowdown is not None and self.slowdown >= 1):
            raise ValueError(f"device {self.name}: slowdown={self.slowdown} must be >= 1 (1 = its real speed)")
        self.profile()  # DeviceProfile's checks, with its messages

    def profile(self) -> DeviceProfile:
        """The DeviceProfile allocators use."""
        tpf = self.time_per_flop_s if self.time_per_flop_s is not None else 1.0 / self.flops_per_s
        try:
            return DeviceProfile(tpf * self.slowdown, math.inf if self.memory_bytes is None else self.memory_bytes,
                                 self.latency_s, math.inf if self.bandwidth_bytes_per_s is None
                                 else self.bandwidth_bytes_per_s, name=self.name)
        except ValueError as exc:
            raise ValueError(f"device {self.name}: {exc}") from None


@dataclass(frozen=True, kw_only=True, slots=True)
class DevicesFile:
    """devices.yaml: the devices in pipeline order."""

    devices: tuple[DeviceSpec, ...]

    def __post_init__(self) -> None:
        if not self.devices:
            raise ValueError("devices is empty; list at least one device")
        names = [d.name for d in self.devices]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"device name {dup[0]!r} appears twice; give every device a distinct name")


def load_devices(path: str | Path) -> list[DeviceProfile]:
    """Read devices.yaml into DeviceProfiles (ConfigError naming the file and key on bad input)."""
    from nebula.config.schema import load_yaml

    return [d.profile() for d in load_yaml(DevicesFile, path).devices]
