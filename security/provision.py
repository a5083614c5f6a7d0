"""One-step federation set-up: CA, per-cluster switch certificates, worker credentials and switch configs."""
from __future__ import annotations

import ipaddress
import os
import random
import secrets
import shutil
import socket
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Sequence

import yaml

from security._files import PUBLIC, atomic_write
from security.audit import generate_signing_key
from security.ca import CertificateAuthority
from security.curve import write_curve_keypair
from security.errors import CAError, SecurityError
from security.identity import check_name

__all__ = ["provision", "free_ports"]


def free_ports(host: str, count: int) -> list[int]:
    """`count` distinct free TCP ports on `host`, chosen below the kernel's ephemeral range and checked by binding.

    Ports from bind(0) come from the ephemeral range, which every outgoing connection on the host draws from too
    (a switch dialling a peer that is not listening yet can even connect to itself), so such a port may be taken
    between provisioning and the switch's start. Ports below that range are only ever taken by explicit binds.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    low, high = 10000, _ephemeral_low()
    rng = random.SystemRandom()
    with ExitStack() as stack:
        ports: list[int] = []
        for _ in range(200 * count):
            if len(ports) == count:
                break
            port = rng.randrange(low, high) if high > low else 0
            s = stack.enter_context(socket.socket(family, socket.SOCK_STREAM))
            try:
                s.bind((host, port))
            except OSError:
                continue
            if s.getsockname()[1] not in ports:
                ports.append(s.getsockname()[1])
        if len(ports) < count:
            raise OSError(f"found only {len(ports)} of {count} free ports on {host}; pass explicit ports or free some")
        return ports


def _ephemeral_low() -> int:
    """First port of the kernel's ephemeral range (32768 where it cannot be read)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _addr(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _dump(path: Path, data: dict, mode: int = PUBLIC) -> None:
    atomic_write(path, yaml.safe_dump(data, sort_keys=False).encode(), mode)


def provision(federation: str, clusters: Sequence[str], out: str | os.PathLike, host: str = "127.0.0.1",
              ca_dir: str | os.PathLike | None = None, account: str = "nebula",
              ca_passphrase: str | bytes | None = None) -> dict:
    """Create `out/ca` (unless `ca_dir`), and per cluster `out/<cluster>/` with switch.yaml, worker.yaml and keys.

    Everything is built in a staging directory inside `out` and moved into place at the end, so a failure
    leaves no half-provisioned cluster behind. Returns a summary: paths, listen addresses and endpoints.
    """
    check_name(federation, "federation")
    check_name(account, "account")
    clusters = [check_name(c, "cluster") for c in clusters]
    if not clusters:
        raise SecurityError("no clusters given; pass --clusters A,B")
    if len(set(clusters)) != len(clusters):
        raise SecurityError(f"clusters {','.join(clusters)} name a cluster twice; give each once")
    out = Path(out)
    ip = None
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        pass
    targets = [out / c for c in clusters] + ([] if ca_dir else [out / "ca"])
    for t in targets:
        if t.exists():
            raise SecurityError(f"{t} already exists; provision into a new --out directory or remove it first")
    out.mkdir(parents=True, exist_ok=True)
    if ca_dir is not None:
        ca = CertificateAuthority.open(ca_dir, ca_passphrase)
        if ca.federation != federation:
            raise CAError(f"CA {ca_dir} belongs to federation {ca.federation!r}, not {federation!r}; "
                          "pass the matching --federation or another --ca")
        ca.key  # a wrong passphrase fails here, before anything is written
    stage = Path(tempfile.mkdtemp(dir=out, prefix=".provision-"))
    try:
        if ca_dir is None:
            ca = CertificateAuthority.init(stage / "ca", federation, ca_passphrase)
            ca_ref = {"ca": "../ca/ca.pem", "crl": "../ca/crl.pem"}
        else:
            ca_ref = {"ca": str(Path(ca_dir).resolve() / "ca.pem"), "crl": str(Path(ca_dir).resolve() / "crl.pem")}
        if host == "127.0.0.1":  # one draw, so a WAN port and a local port can never be the same
            both = free_ports(host, 2 * len(clusters))
            ports, local_ports = both[:len(clusters)], both[len(clusters):]
        else:
            ports, local_ports = free_ports(host, len(clusters)), free_ports("127.0.0.1", len(clusters))
        listen = {c: _addr(host, p) for c, p in zip(clusters, ports)}
        summary: dict = {"federation": federation, "ca": str((Path(ca_dir) if ca_dir else out / "ca").resolve()),
                         "clusters": {}}
        for cluster, local_port in zip(clusters, local_ports):
            d = stage / cluster
            endpoint = f"tcp://127.0.0.1:{local_port}"
            # workers on the switch's host use a Linux abstract socket: no file to clean up, no path length limit
            ipc = f"ipc://@nebula-{federation}-{cluster}-{secrets.token_hex(6)}" if sys.platform == "linux" else ""
            ca.issue("switch", "switch", cluster, dns=["localhost"] if ip else ["localhost", host],
                     ips=[host] if ip else [], out_dir=d, stem="switch")
            switch_public = write_curve_keypair(d / "switch_curve.key_secret")
            generate_signing_key(d / "audit_signing.key")
            worker_public = write_curve_keypair(d / "workers" / "worker.key_secret")
            ca.issue("worker", "worker", cluster, out_dir=d / "workers", stem="worker")
            _dump(d / "switch.yaml", {
                "federation": federation,
                "cluster": cluster,
                "listen": listen[cluster],
                "tls": {"ca": ca_ref["ca"], "cert": "switch.pem", "key": "switch.key", "crl": ca_ref["crl"]},
                "local": {"endpoint": endpoint, "ipc_endpoint": ipc, "curve_secret_key": "switch_curve.key_secret",
                          "workers": [{"name": "worker", "account": account, "curve_public_key": worker_public}]},
                "audit": {"log": "audit.log", "signing_key": "audit_signing.key"},
                "peers": [{"cluster": p, "address": listen[p]} for p in clusters if p != cluster],
                "state_dir": "state",
            })
            _dump(d / "worker.yaml", {
                "federation": federation,
                "cluster": cluster,
                "endpoint": endpoint,
                "ipc_endpoint": ipc,
                "switch_curve_public_key": switch_public,
                "curve_key": "workers/worker.key_secret",
                "account": account,
                "name": "worker",
            }, 0o600)
            os.chmod(d / "workers", 0o700)
            os.chmod(d, 0o700)
            summary["clusters"][cluster] = {
                "dir": str((out / cluster).resolve()),
                "switch_yaml": str((out / cluster / "switch.yaml").resolve()),
                "worker_yaml": str((out / cluster / "worker.yaml").resolve()),
                "listen": listen[cluster],
                "endpoint": endpoint,
                "switch_curve_public_key": switch_public,
            }
        ca.audit_event("federation.provision", federation, detail={"clusters": clusters, "out": str(out.resolve())})
        for t in targets:
            os.replace(stage / t.name, t)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return summary
