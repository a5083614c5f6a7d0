"""Per-site kits: everything one cluster's gateway needs, with that site's own secrets only, and peers updates.

A kit is a directory named after its cluster: the switch's certificate, TLS key, CURVE key pair and audit signing
key, its workers' credentials, the federation's CA certificate and CRL, `switch.yaml` and one worker file per
worker credential (every path in them relative to the kit), `start` (runs the switch server from the kit),
`README.md` (what to run there) and `kit.yaml` (federation, cluster, revision). `archive()` packs it into a
`.tar.gz` to ship: links are stored as the files they point at, and what a running switch writes (its audit log,
state, logs) stays out. A peers update is a small archive for a site already running: `update.yaml` (its peers
at a later revision) and the current CRL, applied by `apply_update` (`nebula-switch reload --update`).
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
from cryptography import x509

from security._files import PRIVATE, PUBLIC, atomic_write
from security._yaml import NoAliases, YamlError, check_keys
from security.audit import generate_signing_key
from security.ca import CertificateAuthority
from security.curve import write_curve_keypair
from security.errors import SecurityError, TLSConfigError
from security.federation import ClusterSpec, FederationSpec, is_ip
from security.kit_text import kit_readme, start_script
from security.tls import load_crl

__all__ = ["KIT_FILE", "Kit", "UpdateError", "apply_update", "archive", "build_kit", "peers_of", "set_peers",
           "worker_file", "write_update"]

KIT_FILE = "kit.yaml"
UPDATE_FILE = "update.yaml"
# what a running switch writes into its directory: never shipped (it is the site's own history)
RUNTIME = {"audit.log", "state", "switch.log", "switch.stderr", "switch.stdout"}
MAX_UPDATE_BYTES = 1 << 20


class UpdateError(SecurityError):
    """A peers update cannot be applied; the message names the archive, the problem and the fix."""


@dataclass(frozen=True)
class Kit:
    """What building a kit issued: the serials to revoke when the cluster leaves, and its switch's CURVE key."""

    cluster: str
    serials: tuple[int, ...]
    switch_curve_public_key: str


def worker_file(name: str) -> str:
    """The worker file of worker credential `name` in a kit."""
    return "worker.yaml" if name == "worker" else f"worker-{name}.yaml"


def peers_of(spec: FederationSpec, cluster: ClusterSpec) -> list[dict[str, Any]]:
    """The `peers:` of `cluster`'s switch.yaml: every other cluster at its public address."""
    return [{"cluster": p.name, "address": p.address} for p in spec.clusters if p.name != cluster.name]


def _dump(path: Path, data: dict, mode: int = PUBLIC) -> None:
    atomic_write(path, yaml.safe_dump(data, sort_keys=False).encode(), mode)


def _link(target: str, at: Path) -> None:
    """A symlink `at` -> `target` (the admin's copy shares the CA's files; archives store the files)."""
    if at.is_symlink() or at.exists():
        at.unlink()
    os.symlink(target, at)


def build_kit(ca: CertificateAuthority, spec: FederationSpec, cluster: ClusterSpec, d: Path, ca_dir: str,
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
        _dump(d / worker_file(name), {
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
    _dump(d / "switch.yaml", doc)
    _dump(d / KIT_FILE, {"federation": spec.federation, "cluster": cluster.name, "revision": revision})
    atomic_write(d / "start", start_script(spec.federation, cluster.name).encode(), 0o755)
    atomic_write(d / "README.md", kit_readme(spec, cluster, revision).encode(), PUBLIC)
    os.chmod(d / "workers", 0o700)
    os.chmod(d, 0o700)
    return Kit(cluster.name, tuple(serials), switch_public)


def set_peers(spec: FederationSpec, cluster: ClusterSpec, d: Path, revision: int) -> bool:
    """Bring the admin's copy of an existing kit to `spec` (its peers, its own listen address); whether it changed."""
    path = d / "switch.yaml"
    doc = _read(path, "switch.yaml")
    new = {**doc, "listen": cluster.listen, "peers": peers_of(spec, cluster)}
    if new == doc:
        return False
    _dump(path, new)
    _dump(d / KIT_FILE, {"federation": spec.federation, "cluster": cluster.name, "revision": revision})
    atomic_write(d / "README.md", kit_readme(spec, cluster, revision).encode(), PUBLIC)
    return True


def _read(path: Path, what: str) -> dict[str, Any]:
    try:
        doc = yaml.load(path.read_text(), Loader=NoAliases)  # noqa: S506 - a SafeLoader without aliases
    except (OSError, yaml.YAMLError) as exc:
        raise SecurityError(f"{what} {path} cannot be read ({exc}); provision the kit again") from None
    if not isinstance(doc, dict):
        raise SecurityError(f"{what} {path} holds no mapping; provision the kit again")
    return doc


def _add(tar: tarfile.TarFile, name: str, data: bytes, mode: int) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), mode
    tar.addfile(info, io.BytesIO(data))


def archive(d: Path, dest: Path) -> Path:
    """Pack kit `d` into `dest` (.tar.gz, mode 0600: it holds the site's secrets), as directory `d.name`."""
    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        parts = Path(info.name).parts
        if len(parts) > 1 and (parts[1] in RUNTIME or parts[1].startswith(".")):
            return None
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        return info

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", dereference=True) as tar:
        tar.add(d, arcname=d.name, filter=keep)
    return atomic_write(dest, buf.getvalue(), PRIVATE)


def write_update(spec: FederationSpec, cluster: ClusterSpec, crl: Path, dest: Path, revision: int) -> Path:
    """The peers update of an existing site at `revision`: its peers now, and the current CRL."""
    doc = {"federation": spec.federation, "cluster": cluster.name, "revision": revision, "listen": cluster.listen,
           "peers": peers_of(spec, cluster)}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        _add(tar, UPDATE_FILE, yaml.safe_dump(doc, sort_keys=False).encode(), 0o644)
        _add(tar, "crl.pem", crl.read_bytes(), 0o644)
    return atomic_write(dest, buf.getvalue(), PUBLIC)


def _members(path: Path) -> dict[str, bytes]:
    """The files of update archive `path`: only update.yaml and crl.pem, small, regular."""
    try:
        if path.stat().st_size > MAX_UPDATE_BYTES:
            raise UpdateError(f"{path} is larger than a peers update can be; is it a kit?")
        out = {}
        with tarfile.open(path, "r:gz") as tar:
            for info in tar:
                if info.name not in (UPDATE_FILE, "crl.pem") or not info.isfile() or info.size > MAX_UPDATE_BYTES:
                    raise UpdateError(f"{path} holds {info.name!r}; a peers update holds only {UPDATE_FILE} and "
                                      "crl.pem (is it a kit? extract a kit with tar instead)")
                out[info.name] = tar.extractfile(info).read()
    except (OSError, tarfile.TarError, EOFError) as exc:
        raise UpdateError(f"{path} is not a peers update archive ({exc}); use the updates/<cluster>-r<N>.tar.gz "
                          "that `nebula-admin provision` wrote") from None
    if set(out) != {UPDATE_FILE, "crl.pem"}:
        raise UpdateError(f"{path} lacks {' and '.join({UPDATE_FILE, 'crl.pem'} - set(out))}; ask the admin for it again")
    return out


def apply_update(config: Path, update: Path) -> str:
    """Apply peers update `update` to the kit of switch.yaml `config`: its peers and CRL, its revision; what changed
    (one line). UpdateError when it is for another federation or cluster, older than the kit, or its CRL is not
    signed by the kit's CA; nothing is written then."""
    files = _members(update)
    try:
        doc = yaml.load(files[UPDATE_FILE].decode(), Loader=NoAliases)  # noqa: S506 - a SafeLoader without aliases
        check_keys(doc, UPDATE_FILE, {"federation": str, "cluster": str, "revision": int, "listen": str,
                                      "peers": list}, required=("federation", "cluster", "revision", "peers"))
        for i, p in enumerate(doc["peers"]):
            check_keys(p, f"peers[{i}]", {"cluster": str, "address": str, "accounts": list},
                       required=("cluster", "address"))
    except (yaml.YAMLError, UnicodeDecodeError, YamlError) as exc:
        raise UpdateError(f"{update}: {UPDATE_FILE} is unusable ({exc}); ask the admin for it again") from None
    config = Path(config)
    sw = _read(config, "switch config")
    base = config.resolve().parent
    kit = _read(base / KIT_FILE, "kit file") if (base / KIT_FILE).exists() else {"revision": 0}
    mine = (sw.get("federation"), sw.get("cluster"))
    if (doc["federation"], doc["cluster"]) != mine:
        raise UpdateError(f"{update} is for cluster {doc['cluster']} of federation {doc['federation']}, this switch "
                          f"({config}) is {mine[1]} of {mine[0]}; apply {mine[1]}'s own update")
    if doc["revision"] <= int(kit.get("revision", 0)):
        raise UpdateError(f"{update} is revision {doc['revision']}, this kit is at revision {kit.get('revision')} "
                          "already; apply only a newer update (the highest -r<N> the admin sent)")
    tls = sw.get("tls") or {}
    ca_path, crl_path = (base / tls.get("ca", "ca.pem")), (base / tls.get("crl", "crl.pem"))
    staged = crl_path.with_name(f".{crl_path.name}.update")
    atomic_write(staged, files["crl.pem"], PUBLIC)
    try:
        revoked = len(load_crl(staged, x509.load_pem_x509_certificate(ca_path.read_bytes())))
    except (TLSConfigError, OSError, ValueError) as exc:
        staged.unlink()
        raise UpdateError(f"{update}: its CRL cannot be used with this kit's CA {ca_path} ({exc}); ask the admin "
                          "for a fresh update") from None
    if crl_path.is_symlink():
        crl_path.unlink()
    os.replace(staged, crl_path)
    moved = doc.get("listen") and doc["listen"] != sw.get("listen")
    _dump(config, {**sw, "peers": doc["peers"], **({"listen": doc["listen"]} if moved else {})})
    _dump(base / KIT_FILE, {**kit, "revision": doc["revision"]})
    peers = ", ".join(f"{p['cluster']} {p['address']}" for p in doc["peers"]) or "none"
    restart = f"; this switch now listens on {doc['listen']}: restart it to bind there" if moved else ""
    return f"revision {doc['revision']}: peers {peers}; CRL revokes {revoked} certificate(s){restart}"
