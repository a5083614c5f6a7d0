"""A WAN between two clusters on one machine: two network namespaces joined by a veth pair shaped with `tbf`.

The switch link's own shaper (`link.shape`) emulates a slow WAN in user space everywhere; where root is
available this gives the kernel's version of it, as in DESIGN.md §7: each cluster's processes run in their own
namespace (`argv(side, ...)` prefixes `ip netns exec`), their switches reach each other over the veth pair, and
`tc ... tbf` limits each direction to `rate_mbit`. The addresses are private to the two namespaces, which
`close()` (or leaving the `with` block) removes together with the veth pair.
"""
from __future__ import annotations

__all__ = ["NetnsError", "WanNamespaces"]

import os
import random
import shutil
import subprocess
from typing import Sequence


class NetnsError(RuntimeError):
    """The namespaces could not be set up (not root, no iproute2, ...)."""


def _run(argv: Sequence[str]) -> None:
    proc = subprocess.run(list(argv), capture_output=True, text=True)
    if proc.returncode != 0:
        raise NetnsError(f"`{' '.join(argv)}` failed: {proc.stderr.strip() or proc.stdout.strip()}")


class WanNamespaces:
    """Two namespaces, side 0 and side 1, with addresses `address(0)` and `address(1)` on a shaped veth pair."""

    def __init__(self, rate_mbit: float | None = 60.0, prefix: str = "nebula") -> None:
        if rate_mbit is not None and rate_mbit <= 0:
            raise ValueError(f"rate_mbit={rate_mbit} must be > 0 (or None for an unshaped link)")
        if os.geteuid() != 0:
            raise NetnsError("network namespaces need root (ip netns, tc); run as root or use link.shape instead")
        for tool in ("ip", "tc"):
            if shutil.which(tool) is None:
                raise NetnsError(f"`{tool}` not found; install iproute2 (apt-get install iproute2)")
        tag = f"{os.getpid() % 100000}{random.randrange(1000):03d}"
        self.names = (f"{prefix}-{tag}-a", f"{prefix}-{tag}-b")
        self.devices = (f"nb{tag}a", f"nb{tag}b")  # interface names: at most 15 characters
        # a random /30 in 10.200.0.0/13: seen only inside these two namespaces
        net = random.randrange(200 * 65536, 208 * 65536) & ~3
        self._addresses = tuple(f"10.{net >> 16}.{(net >> 8) & 255}.{(net & 255) + i}" for i in (1, 2))
        self.rate_mbit = rate_mbit
        self._created: list[str] = []
        try:
            self._setup()
        except BaseException:
            self.close()
            raise

    def _setup(self) -> None:
        for name in self.names:
            _run(["ip", "netns", "add", name])
            self._created.append(name)
        _run(["ip", "link", "add", self.devices[0], "type", "veth", "peer", "name", self.devices[1]])
        for side in (0, 1):
            ns, dev = self.names[side], self.devices[side]
            _run(["ip", "link", "set", dev, "netns", ns])
            _run(["ip", "-n", ns, "addr", "add", f"{self._addresses[side]}/30", "dev", dev])
            _run(["ip", "-n", ns, "link", "set", dev, "up"])
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
            if self.rate_mbit is not None:
                rate_bytes = self.rate_mbit * 1e6 / 8
                # the bucket must hold at least one timer tick of traffic and one (GSO) packet
                burst = max(64 * 1024, int(rate_bytes / 100))
                _run(["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate", f"{self.rate_mbit}mbit",
                      "burst", str(burst), "latency", "100ms"])

    def address(self, side: int) -> str:
        """IPv4 address of side 0 or 1 on the veth pair."""
        return self._addresses[side]

    def argv(self, side: int, argv: Sequence[str]) -> list[str]:
        """`argv` run inside side 0's or side 1's namespace."""
        return ["ip", "netns", "exec", self.names[side], *argv]

    def close(self) -> None:
        """Remove both namespaces (and with them the veth pair)."""
        while self._created:
            name = self._created.pop()
            subprocess.run(["ip", "netns", "del", name], capture_output=True)

    def __enter__(self) -> WanNamespaces:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
