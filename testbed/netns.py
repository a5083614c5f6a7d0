"""Sites on their own hosts, on one machine: one network namespace per site, joined by a WAN of veth pairs.

Each site (a cluster's gateway host) gets a namespace with its own loopback and one interface `eth0` with its own
address; the other end of each `eth0` is a port of a bridge that lives in a namespace of its own (the WAN), so
nothing appears in the host's own network stack and every address is seen only inside these namespaces.
`argv(site, ...)` prefixes `ip netns exec`, so a process of one site reaches another only through the WAN, and
workers reach their switch on the site's own loopback or abstract IPC socket, which are per namespace too.

The WAN's faults are knobs of the harness (the kernel has no `netem` here):
- `set_rate(site, mbit)`: `tc ... tbf` on the site's uplink, both directions;
- `set_loss(site, per_mille)`: nftables drops that share of packets arriving at the site (input hook; needs `nft`,
  `apt-get install nftables`);
- `link_down(site)` / `link_up(site)`: the site's WAN port goes down and comes back;
- `add(site)` / `remove(site)`: a site joins or leaves while the others run.
Processes (switch kill and restart, a whole cluster killed) are the federation harness's (`testbed.federation`).
`close()` (or leaving the `with` block) removes every namespace, and with them every interface and rule.
"""
from __future__ import annotations

__all__ = ["NetnsError", "Sites", "needs_root"]

import ipaddress
import os
import random
import shutil
import subprocess
from typing import Mapping, Sequence


class NetnsError(RuntimeError):
    """The namespaces could not be set up (not root, no iproute2, ...); the message names the fix."""


def needs_root() -> None:
    """NetnsError naming the fix unless this process may create namespaces and run `ip` and `tc`."""
    if os.geteuid() != 0:
        raise NetnsError("network namespaces need root (ip netns, tc); run as root, or leave these tests out with "
                         "`make test-no-root` (pytest -m 'not root')")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise NetnsError(f"`{tool}` not found; install iproute2 (apt-get install iproute2)")


def _run(argv: Sequence[str], stdin: str | None = None) -> None:
    proc = subprocess.run(list(argv), capture_output=True, text=True, input=stdin)
    if proc.returncode != 0:
        raise NetnsError(f"`{' '.join(argv)}` failed: {proc.stderr.strip() or proc.stdout.strip()}")


class Sites:
    """Sites `names`, each in its own namespace with address `address(site)` on a WAN shaped to `rate_mbit`.

    `addresses` pins the sites' addresses (as a README names them); by default each gets one in a random /24 of
    10.200.0.0/13. A site is named or given by its index in `names`.
    """

    PREFIXLEN = 24

    def __init__(self, names: Sequence[str] = ("A", "B"), *, rate_mbit: float | None = None,
                 addresses: Mapping[str, str] | None = None, prefix: str = "nebula") -> None:
        if rate_mbit is not None and rate_mbit <= 0:
            raise ValueError(f"rate_mbit={rate_mbit} must be > 0 (or None for an unshaped link)")
        needs_root()
        self.tag = f"{prefix}-{os.getpid() % 100000}{random.randrange(1000):03d}"
        self.wan = f"{self.tag}-wan"
        self.order: list[str] = []
        self.namespaces: dict[str, str] = {}
        self.ports: dict[str, str] = {}  # site -> its port on the WAN bridge
        self.rates: dict[str, float | None] = {}
        self._addresses: dict[str, str] = {}
        base = random.randrange(200 * 256, 208 * 256)
        self._net = ipaddress.ip_network(f"10.{base >> 8}.{base & 255}.0/24")
        self._pinned = dict(addresses or {})
        self.rate_mbit = rate_mbit
        self._created: list[str] = []
        try:
            _run(["ip", "netns", "add", self.wan])
            self._created.append(self.wan)
            _run(["ip", "-n", self.wan, "link", "add", "wan0", "type", "bridge"])
            _run(["ip", "-n", self.wan, "link", "set", "wan0", "up"])
            for name in names:
                self.add(name)
        except BaseException:
            self.close()
            raise

    # ---- sites ----
    def add(self, name: str, address: str | None = None) -> str:
        """A new site `name` on the WAN (also while the others run); its address."""
        if name in self.namespaces:
            raise ValueError(f"site {name!r} exists already")
        index = len(self.order) + 1
        address = address or self._pinned.get(name) or str(self._net[index])
        ns, port = f"{self.tag}-{index}", f"p{index}"
        _run(["ip", "netns", "add", ns])
        self._created.append(ns)
        self.order.append(name)
        self.namespaces[name], self.ports[name], self._addresses[name] = ns, port, address
        _run(["ip", "-n", self.wan, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns])
        _run(["ip", "-n", self.wan, "link", "set", port, "master", "wan0", "up"])
        _run(["ip", "-n", ns, "addr", "add", f"{address}/{self.PREFIXLEN}", "dev", "eth0"])
        _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
        _run(["ip", "-n", ns, "link", "set", "lo", "up"])
        self.set_rate(name, self.rate_mbit)
        return address

    def remove(self, site: str | int) -> None:
        """Take a site off the WAN: its namespace goes (stop its processes first: they would keep it alive)."""
        name = self._name(site)
        ns = self.namespaces.pop(name)
        self.ports.pop(name)
        self.order.remove(name)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self._created.remove(ns)

    def _name(self, site: str | int) -> str:
        name = self.order[site] if isinstance(site, int) else site
        if name not in self.namespaces:
            raise KeyError(f"no site {site!r}; sites: {', '.join(self.order)}")
        return name

    def address(self, site: str | int) -> str:
        """The site's IPv4 address on the WAN."""
        return self._addresses[self._name(site)]

    def netns(self, site: str | int) -> str:
        """The name of the site's network namespace (for `ip netns exec`)."""
        return self.namespaces[self._name(site)]

    def argv(self, site: str | int, argv: Sequence[str]) -> list[str]:
        """`argv` run inside the site's namespace."""
        return ["ip", "netns", "exec", self.netns(site), *argv]

    # ---- faults ----
    def set_rate(self, site: str | int, rate_mbit: float | None) -> None:
        """Shape the site's uplink to `rate_mbit` each way (`tc ... tbf`); None removes the shaping."""
        name = self._name(site)
        for ns, dev in ((self.namespaces[name], "eth0"), (self.wan, self.ports[name])):
            if rate_mbit is None:
                if self.rates.get(name) is not None:
                    _run(["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"])
                continue
            rate_bytes = rate_mbit * 1e6 / 8
            # the bucket must hold at least one timer tick of traffic and one (GSO) packet
            burst = max(64 * 1024, int(rate_bytes / 100))
            _run(["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{rate_mbit}mbit",
                  "burst", str(burst), "latency", "100ms"])
        self.rates[name] = rate_mbit

    def set_loss(self, site: str | int, per_mille: int) -> None:
        """Drop `per_mille` of the packets that reach the site from the WAN (nftables, input hook); 0 stops it."""
        if not 0 <= per_mille <= 1000:
            raise ValueError(f"per_mille={per_mille} must be in [0, 1000]")
        if shutil.which("nft") is None:
            raise NetnsError("`nft` not found; install nftables (apt-get install nftables)")
        ns = self.netns(site)
        subprocess.run(["ip", "netns", "exec", ns, "nft", "delete", "table", "inet", "nebula_faults"],
                       capture_output=True)  # (absent the first time)
        if per_mille:
            rules = ("table inet nebula_faults {\n chain input {\n  type filter hook input priority 0; policy accept;\n"
                     f"  iifname \"eth0\" numgen random mod 1000 < {per_mille} drop\n }}\n}}\n")
            _run(["ip", "netns", "exec", ns, "nft", "-f", "-"], stdin=rules)

    def link_down(self, site: str | int) -> None:
        """Cut the site off the WAN (its bridge port down): packets either way are lost until `link_up`."""
        _run(["ip", "-n", self.wan, "link", "set", self.ports[self._name(site)], "down"])

    def link_up(self, site: str | int) -> None:
        """Bring the site's WAN port back."""
        _run(["ip", "-n", self.wan, "link", "set", self.ports[self._name(site)], "up"])

    # ---- end ----
    def close(self) -> None:
        """Remove every namespace (and with them the veth pairs, the bridge, the rules)."""
        while self._created:
            subprocess.run(["ip", "netns", "del", self._created.pop()], capture_output=True)

    def __enter__(self) -> Sites:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
