"""The federation file (`federation.yaml`): a federation's name, CA settings, and each cluster with its public
address, its accounts and its link options, from which `nebula-admin provision --from` makes one kit per site.

    federation: acme
    ca: {days: 3650, cert_days: 90, crl_days: 7, passphrase_env: ACME_CA_PASSPHRASE}   # optional
    link: {shape: {rate_mbit: 60}}          # optional: `link:` of every switch.yaml (limits: likewise)
    clusters:
      - name: A
        host: 10.70.0.1                     # the address peers dial (an IP or a DNS name)
        port: 7443                          # the WAN port there
        listen: 0.0.0.0:7443                # optional: what the switch binds (default host:port for an IP,
                                            #   0.0.0.0:port for a name)
        local: tcp://127.0.0.1:7444         # optional: where workers reach the switch (default port + 1 on 127.0.0.1)
        local_tls: 10.70.0.1:7445           # optional: where workers on other hosts reach it over mutual TLS with
                                            #   their kit's certificates instead of CURVE (default: not offered)
        accounts: [{name: nebula, workers: [worker]}]   # optional (this default): one worker credential each
        link: {}                            # optional: over the federation's link options, for this cluster
      - {name: B, host: 10.70.0.2, port: 7443}

`link:` and `limits:` are copied into the switch.yaml files as they are; the switch checks them when it loads its
file (an unknown key or a bad value stops it with one line naming the file and the key).
"""
from __future__ import annotations

import dataclasses
import ipaddress
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from security._yaml import YamlError, check_keys, read_yaml
from security.errors import IdentityError, SecurityError
from security.identity import check_name

__all__ = ["AccountSpec", "CASpec", "SiteSpec", "FederationError", "FederationSpec", "is_ip", "is_loopback",
           "load_federation", "parse_federation", "federation_doc", "split_address"]

_HOST = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?")
DEFAULT_ACCOUNT = "nebula"
DEFAULT_WORKER = "worker"
MIN_CRL_DAYS = 1 / 86400  # one second: a CRL lifetime in seconds is for drills and tests


class FederationError(SecurityError, ValueError):
    """A federation file (or the flags standing for one) cannot be used; the message names the key and the fix."""


def split_address(address: str, what: str) -> tuple[str, int]:
    """(host, port) of `host:port` (IPv6 as `[::1]:port`); FederationError naming `what` otherwise."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise FederationError(f"{what} {address!r} is not host:port (e.g. 0.0.0.0:7443)")
    return host.strip("[]"), int(port)


def is_loopback(host: str) -> bool:
    """Whether `host` names this machine only (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class AccountSpec:
    """An account of a cluster and the names of the worker credentials made for it."""

    name: str = DEFAULT_ACCOUNT
    workers: tuple[str, ...] = (DEFAULT_WORKER,)


@dataclass(frozen=True, slots=True)
class SiteSpec:
    """One site: its cluster name, public WAN address, what its switch binds, its workers' endpoint, accounts."""

    name: str
    host: str
    port: int
    listen: str
    local: str
    accounts: tuple[AccountSpec, ...] = (AccountSpec(),)
    link: dict = field(default_factory=dict)
    limits: dict = field(default_factory=dict)
    local_tls: str = ""  # host:port of the switch's TLS endpoint for workers ("": none)

    @property
    def address(self) -> str:
        """host:port as peers dial it."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def worker_names(self) -> list[tuple[str, str]]:
        """(account, worker name) of every worker credential, in file order."""
        return [(a.name, w) for a in self.accounts for w in a.workers]


@dataclass(frozen=True, slots=True)
class CASpec:
    """The federation CA: its lifetime, its certificates' lifetime, where its key's passphrase comes from."""

    days: int = 3650
    cert_days: int | None = None  # (None: the CA's defaults, security.ca.DEFAULT_DAYS)
    # the CRL's next update, in days (a fraction is allowed: short lifetimes for drills and tests); switches refuse
    # a CRL past it, so `nebula-admin provision renew` (from cron) sends the sites a fresh one before
    crl_days: int | float = 7
    passphrase_env: str | None = None


@dataclass(frozen=True, slots=True)
class FederationSpec:
    """A whole federation as its file describes it."""

    federation: str
    clusters: tuple[SiteSpec, ...]
    ca: CASpec = CASpec()
    link: dict = field(default_factory=dict)
    limits: dict = field(default_factory=dict)

    def cluster(self, name: str) -> SiteSpec:
        """The cluster `name`, or FederationError naming the known ones."""
        for c in self.clusters:
            if c.name == name:
                return c
        raise FederationError(f"federation {self.federation} has no cluster {name!r}; it has "
                              f"{', '.join(c.name for c in self.clusters) or 'none'}")

    def names(self) -> list[str]:
        """Cluster names in file order."""
        return [c.name for c in self.clusters]

    def with_clusters(self, clusters: list[SiteSpec]) -> "FederationSpec":
        """The same federation with `clusters` instead (checked again)."""
        return _checked(dataclasses.replace(self, clusters=tuple(clusters)))


def _name(value: Any, path: str, what: str) -> str:
    try:
        return check_name(value, what)
    except IdentityError as exc:
        raise FederationError(f"{path}: {exc}") from None


def _cluster(doc: Any, path: str) -> SiteSpec:
    check_keys(doc, path, {"name": str, "host": str, "port": int, "listen": str, "local": str, "local_tls": str,
                           "accounts": list, "link": dict, "limits": dict}, required=("name", "host", "port"))
    name = _name(doc["name"], f"{path}.name", "cluster")
    host = doc["host"].strip("[]")
    if not (is_ip(host) or _HOST.fullmatch(host)):
        raise FederationError(f"{path}.host {doc['host']!r} is neither an IP address nor a host name; give the "
                              "address its peers dial")
    port = doc["port"]
    if not 0 <= port <= 65535 or (port == 0 and not is_loopback(host)):
        raise FederationError(f"{path}.port {port} must be 1-65535 (0, a free port picked here, only for a "
                              "cluster on this machine's loopback)")
    listen = doc.get("listen") or (f"{doc['host']}:{port}" if is_ip(host) else f"0.0.0.0:{port}")
    split_address(listen, f"{path}.listen")
    local = doc.get("local") or f"tcp://127.0.0.1:{port + 1 if port else 0}"
    if not local.startswith("tcp://"):
        raise FederationError(f"{path}.local {local!r} must be tcp://HOST:PORT (where this cluster's workers reach "
                              "its switch)")
    split_address(local[len("tcp://"):], f"{path}.local")
    local_tls = doc.get("local_tls") or ""
    if local_tls:
        tls_host, tls_port = split_address(local_tls, f"{path}.local_tls")
        if tls_port == 0 and not is_loopback(tls_host):
            raise FederationError(f"{path}.local_tls {local_tls!r}: port 0 (a free port picked here) is only for a "
                                  "switch on this machine's loopback; give the port its workers dial")
    accounts = []
    for i, a in enumerate(doc.get("accounts") or [{}]):
        apath = f"{path}.accounts[{i}]"
        check_keys(a, apath, {"name": str, "workers": list})
        workers = tuple(_name(w, f"{apath}.workers", "worker") for w in a.get("workers", [DEFAULT_WORKER]))
        if not workers:
            raise FederationError(f"{apath}.workers is empty; name at least one worker credential")
        accounts.append(AccountSpec(_name(a.get("name", DEFAULT_ACCOUNT), f"{apath}.name", "account"), workers))
    return SiteSpec(name, host, port, listen, local, tuple(accounts), dict(doc.get("link") or {}),
                       dict(doc.get("limits") or {}), local_tls)


def _checked(spec: FederationSpec) -> FederationSpec:
    """`spec` if its clusters are distinct: names, addresses, and ports on a shared host."""
    if not spec.clusters:
        raise FederationError("clusters is empty; list at least one cluster (name, host, port)")
    seen: dict[str, str] = {}
    used: dict[tuple[str, int], str] = {}
    for i, c in enumerate(spec.clusters):
        if c.name in seen:
            raise FederationError(f"clusters[{i}].name {c.name!r} is given twice; give each cluster once")
        seen[c.name] = c.name
        workers = [w for _, w in c.worker_names()]
        if len(set(workers)) != len(workers):
            raise FederationError(f"clusters[{i}] ({c.name}) names a worker twice ({', '.join(workers)}); "
                                  "worker names are unique within a cluster")
        taken = [("port", (c.host, c.port))]
        for key, address in (("local", c.local[len("tcp://"):]), ("local_tls", c.local_tls)):
            if address:
                host, port = split_address(address, key)
                taken.append((key, (host if not is_loopback(host) else c.host, port)))
        for key, (host, port) in taken:
            if port and (host, port) in used:
                raise FederationError(f"clusters[{i}].{key}: {host}:{port} is taken by cluster {used[(host, port)]}; "
                                      "give each cluster on one host its own ports")
            used[(host, port)] = c.name
    return spec


def parse_federation(doc: Any, where: str = "federation file") -> FederationSpec:
    """A FederationSpec from a parsed federation file; FederationError naming `where` and the key otherwise."""
    try:
        check_keys(doc, "", {"federation": str, "ca": dict, "link": dict, "limits": dict, "clusters": list},
                   required=("federation", "clusters"))
        ca = doc.get("ca") or {}
        check_keys(ca, "ca", {"days": int, "cert_days": int, "crl_days": (int, float), "passphrase_env": str})
        for key in ("days", "cert_days"):
            if key in ca and not 1 <= ca[key] <= 36500:
                raise FederationError(f"ca.{key} {ca[key]} must be 1-36500 days")
        if "crl_days" in ca and not MIN_CRL_DAYS <= ca["crl_days"] <= 36500:
            raise FederationError(f"ca.crl_days {ca['crl_days']} must be {MIN_CRL_DAYS:g}-36500 days (a fraction "
                                  "is allowed, e.g. 0.5 for twelve hours)")
        spec = FederationSpec(_name(doc["federation"], "federation", "federation"),
                              tuple(_cluster(c, f"clusters[{i}]") for i, c in enumerate(doc["clusters"])),
                              CASpec(**ca), dict(doc.get("link") or {}), dict(doc.get("limits") or {}))
        return _checked(spec)
    except (YamlError, FederationError) as exc:
        raise FederationError(f"{where}: {exc}") from None


def load_federation(path: str | Path) -> FederationSpec:
    """Read and check a federation file; FederationError of one line naming the file, the key and the fix."""
    try:
        doc = read_yaml(path, "federation file")
    except YamlError as exc:
        raise FederationError(str(exc)) from None
    return parse_federation(doc, str(path))


def federation_doc(spec: FederationSpec) -> dict[str, Any]:
    """The federation file of `spec`, every address written out (what provisioning keeps beside the kits)."""
    doc: dict[str, Any] = {"federation": spec.federation}
    if spec.ca != CASpec():
        doc["ca"] = {k: v for k, v in dataclasses.asdict(spec.ca).items() if v is not None}
    for key in ("link", "limits"):
        if getattr(spec, key):
            doc[key] = getattr(spec, key)
    doc["clusters"] = []
    for c in spec.clusters:
        entry: dict[str, Any] = {"name": c.name, "host": c.host, "port": c.port, "listen": c.listen, "local": c.local}
        if c.local_tls:
            entry["local_tls"] = c.local_tls
        if c.accounts != (AccountSpec(),):
            entry["accounts"] = [{"name": a.name, "workers": list(a.workers)} for a in c.accounts]
        for key in ("link", "limits"):
            if getattr(c, key):
                entry[key] = getattr(c, key)
        doc["clusters"].append(entry)
    return doc
