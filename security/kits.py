"""Per-site kits: everything one cluster's gateway needs, with that site's own secrets only, and peers updates.

A kit is a directory named after its cluster: the switch's certificate, TLS key, CURVE key pair and audit signing
key, its workers' credentials, the federation's CA certificate and CRL, `switch.yaml` and one worker file per
worker credential (every path in them relative to the kit), `start` (runs the switch server from the kit),
`README.md` (what to run there) and `kit.yaml` (federation, cluster, revision). `archive()` packs it into a
`.tar.gz` to ship: links are stored as the files they point at, and what a running switch writes (its audit log,
state, logs) stays out. `kit.sig`, the admin's signed manifest of the kit's files, is written by provisioning
just before the kit is archived (`security.kit_seal.seal_kit`); peers updates for a site already running are `security.updates`.
"""
from __future__ import annotations

import io
import os
import secrets
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from security._files import PRIVATE, PUBLIC, atomic_write
from security._yaml import YamlError, read_yaml
from security.audit import generate_signing_key
from security.ca import CertificateAuthority
from security.curve import write_curve_keypair
from security.errors import SecurityError
from security.federation import SiteSpec, FederationSpec, is_ip
from security.kit_seal import KIT_FILE, RUNTIME
from security.kit_text import kit_readme, start_script

__all__ = ["KIT_FILE", "Kit", "archive", "build_kit", "dump_yaml", "peers_of", "read_doc", "set_peers",
           "worker_file"]


@dataclass(frozen=True)
class Kit:
    """What building a kit issued: the serials to revoke when the cluster leaves, and its switch's CURVE key."""

    cluster: str
    serials: tuple[int, ...]
    switch_curve_public_key: str


def worker_file(name: str) -> str:
    """The worker file of worker credential `name` in a kit."""
    return "worker.yaml" if name == "worker" else f"worker-{name}.yaml"


def peers_of(spec: FederationSpec, cluster: SiteSpec) -> list[dict[str, Any]]:
    """The `peers:` of `cluster`'s switch.yaml: every other cluster at its public address."""
    return [{"cluster": p.name, "address": p.address} for p in spec.clusters if p.name != cluster.name]


def dump_yaml(path: Path, data: dict, mode: int = PUBLIC) -> None:
    """Write `data` as YAML to `path` (atomically)."""
    atomic_write(path, yaml.safe_dump(data, sort_keys=False).encode(), mode)


def _link(target: str, at: Path) -> None:
    """A symlink `at` -> `target` (the admin's copy shares the CA's files; archives store the files)."""
    if at.is_symlink() or at.exists():
        at.unlink()
    os.symlink(target, at)


def build_kit(ca: CertificateAuthority, spec: FederationSpec, cluster: SiteSpec, d: Path, ca_dir: str,
              revision: int) -> Kit:
    """Issue `cluster`'s credentials into the new directory `d` and write its configs, start script and README;
    `ca_dir` is the CA's directory as seen from where the kit will lie (its certificate and CRL are linked)."""
    host, ip = cluster.host, is_ip(cluster.host)
    days = spec.ca.cert_days
    serials = [ca.issue("switch", "switch", cluster.name, days, dns=["localhost"] if ip else ["localhost", host],
                        ips=[host] if ip else [], out_dir=d, stem="switch").serial]
    switch_public = write_curve_keypair(d / "switch_curve.key_secret")
    generate_signing_key(d / "audit_signing.key")
    ipc = f"ipc://@nebula-{spec.federation}-{cluster.name}-{secrets.token_hex(6)}" if sys.platform == "linux" else ""
    workers = []
    for account, name in cluster.worker_names():
        public = write_curve_keypair(d / "workers" / f"{name}.key_secret")
        serials.append(ca.issue(name, "worker", cluster.name, days, out_dir=d / "workers", stem=name).serial)
        workers.append({"name": name, "account": account, "curve_public_key": public})
        tls = {"tls_endpoint": cluster.local_tls,
               "tls": {"ca": "ca.pem", "cert": f"workers/{name}.pem", "key": f"workers/{name}.key", "crl": "crl.pem"}}
        dump_yaml(d / worker_file(name), {
            "federation": spec.federation, "cluster": cluster.name, "endpoint": cluster.local, "ipc_endpoint": ipc,
            **(tls if cluster.local_tls else {}), "switch_curve_public_key": switch_public,
            "curve_key": f"workers/{name}.key_secret", "account": account, "name": name}, PRIVATE)
    _link(os.path.join(ca_dir, "ca.pem"), d / "ca.pem")
    _link(os.path.join(ca_dir, "crl.pem"), d / "crl.pem")
    doc: dict[str, Any] = {
        "federation": spec.federation,
        "cluster": cluster.name,
        "listen": cluster.listen,
        "tls": {"ca": "ca.pem", "cert": "switch.pem", "key": "switch.key", "crl": "crl.pem"},
        "local": {"endpoint": cluster.local, "ipc_endpoint": ipc, "curve_secret_key": "switch_curve.key_secret",
                  **({"tls_endpoint": cluster.local_tls} if cluster.local_tls else {}), "workers": workers},
        "audit": {"log": "audit.log", "signing_key": "audit_signing.key"},
        "peers": peers_of(spec, cluster),
        "state_dir": "state",
    }
    for key in ("link", "limits"):
        merged = {**getattr(spec, key), **getattr(cluster, key)}
        if merged:
            doc[key] = merged
    dump_yaml(d / "switch.yaml", doc)
    dump_yaml(d / KIT_FILE, {"federation": spec.federation, "cluster": cluster.name, "revision": revision})
    atomic_write(d / "start", start_script(spec.federation, cluster.name).encode(), 0o755)
    atomic_write(d / "README.md", kit_readme(spec, cluster, revision).encode(), PUBLIC)
    os.chmod(d / "workers", 0o700)
    os.chmod(d, 0o700)
    return Kit(cluster.name, tuple(serials), switch_public)


def set_peers(spec: FederationSpec, cluster: SiteSpec, d: Path, revision: int) -> bool:
    """Bring the admin's copy of an existing kit to `spec` (its peers, its own listen address); whether it changed."""
    path = d / "switch.yaml"
    doc = read_doc(path, "switch.yaml")
    new = {**doc, "listen": cluster.listen, "peers": peers_of(spec, cluster)}
    if new == doc:
        return False
    dump_yaml(path, new)
    dump_yaml(d / KIT_FILE, {"federation": spec.federation, "cluster": cluster.name, "revision": revision})
    atomic_write(d / "README.md", kit_readme(spec, cluster, revision).encode(), PUBLIC)
    return True


def read_doc(path: Path, what: str) -> dict[str, Any]:
    """The mapping in YAML file `path` of a kit; SecurityError naming it otherwise."""
    try:
        doc = read_yaml(path, what)
    except YamlError as exc:
        raise SecurityError(f"{exc}; provision the kit again") from None
    if not isinstance(doc, dict):
        raise SecurityError(f"{what} {path} holds no mapping; provision the kit again")
    return doc


def archive(d: Path, dest: Path) -> Path:
    """Pack kit `d` into `dest` (.tar.gz, mode 0600: it holds the site's secrets), as directory `d.name`."""
    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        parts = Path(info.name).parts
        if len(parts) > 1 and (parts[1] in RUNTIME or parts[1].startswith((".", "audit.log"))):
            return None
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        return info

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", dereference=True) as tar:
        tar.add(d, arcname=d.name, filter=keep)
    return atomic_write(dest, buf.getvalue(), PRIVATE)
