"""Provisioning a federation and changing it: one kit per site from a federation file (or from flags, the quick
case), clusters added and removed later with a peers update for every site that stays.

The output directory `out` is the admin's: `ca/` (the CA, its key stays here), `federation.yaml` (the federation
as provisioned, every port written out: edit it and provision `--from` it again to change the federation),
`state.json` (revision, each cluster's serials), one kit per cluster `out/<cluster>/` (relative paths only; on this
machine it shares the CA's certificate and CRL through links, so a revocation reaches switches run from here at
once), `kits/<cluster>.tar.gz` (the archive to ship) and `updates/<cluster>-r<N>.tar.gz` (peers updates of a
revision for the sites already running, applied live with `nebula-switch reload --update`). Every kit is sealed and
every update signed with the CA key (`security.kit_seal`, `security.updates`): a switch checks both against the CA
certificate its kit holds. `renew` (from cron) keeps a running federation within its lifetimes: a fresh CRL and the
switch certificates near their expiry renewed (for the sites' own keys), sent to every site as a signed update.
"""
from __future__ import annotations

import dataclasses

import json
import os
import random
import shutil
import socket
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Sequence

import yaml

from security._files import PUBLIC, atomic_write
from cryptography import x509

from security._time import iso, utcnow
from security.ca import CertificateAuthority, format_serial
from security.certbuild import DEFAULT_DAYS, read_csr
from security.errors import CAError, SecurityError
from security.federation import (AccountSpec, CASpec, SiteSpec, FederationError, FederationSpec, federation_doc,
                                 is_loopback, load_federation, parse_federation)
from security.identity import check_name
from security.identity import identity_of
from security.kit_seal import CERT_FILE, KIT_FILE, WORKERS_DIR, seal_kit
from security.signing import key_fingerprint
from security.kits import archive, build_kit, dump_yaml, read_doc, set_peers, worker_file
from security.updates import write_update

__all__ = ["add_cluster", "free_ports", "provision", "provision_spec", "remove_cluster", "renew"]

STATE = "state.json"
SPEC = "federation.yaml"


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


def _resolve_ports(spec: FederationSpec) -> FederationSpec:
    """`spec` with every port 0 (a cluster on this machine's loopback) replaced by a free port of this machine."""
    zero = [c for c in spec.clusters if c.port == 0 or c.local.endswith(":0") or c.local_tls.endswith(":0")]
    if not zero:
        return spec
    ports = iter(free_ports("127.0.0.1", 3 * len(zero)))  # one draw: the WAN and local ports never collide

    def resolved(address: str) -> str:
        return address if not address.endswith(":0") else f"{address.rpartition(':')[0]}:{next(ports)}"

    out = []
    for c in spec.clusters:
        if c in zero:
            port = c.port or next(ports)
            listen = c.listen if not c.listen.endswith(":0") else f"{c.listen.rpartition(':')[0]}:{port}"
            c = dataclasses.replace(c, port=port, listen=listen, local=resolved(c.local),
                                    local_tls=resolved(c.local_tls))
        out.append(c)
    return spec.with_clusters(out)


def _held(out: Path, state: dict) -> str:
    return f"federation {state['federation']} (clusters {', '.join(state['clusters'])})"


def _alternatives(out: Path, new: Sequence[str] = ()) -> str:
    name = new[0] if len(new) == 1 else "NAME"
    return (f"add {'a cluster' if name == 'NAME' else name} with `nebula-admin provision add-cluster {name} --out {out} "
            f"--host HOST --port PORT`, or edit {out / SPEC} and run "
            f"`nebula-admin provision --from {out / SPEC} --out {out}`")


def _load_state(out: Path) -> dict | None:
    try:
        return json.loads((out / STATE).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise SecurityError(f"{out / STATE} cannot be read ({exc}); it records the provisioned federation: "
                            "restore it from a backup") from None


def _passphrase(spec: FederationSpec, given: str | bytes | None) -> str | bytes | None:
    if given is not None or not spec.ca.passphrase_env:
        return given
    value = os.environ.get(spec.ca.passphrase_env)
    if value is None:
        raise SecurityError(f"ca.passphrase_env names {spec.ca.passphrase_env}, which is not set; export it")
    return value


def provision_spec(spec: FederationSpec, out: str | os.PathLike, ca_dir: str | os.PathLike | None = None,
                   ca_passphrase: str | bytes | None = None, *, fresh: bool = False) -> dict:
    """Bring `out` to `spec`: a new federation there, or the one `out` holds with the clusters `spec` adds (their
    kits) and the address changes it makes (peers updates for the sites already running). Clusters that `out`
    holds and `spec` lacks are refused (`remove_cluster` takes one out); `fresh` refuses any existing federation.
    Returns a summary: paths, addresses, kits and updates."""
    out = Path(out)
    state = _load_state(out)
    if state is None:
        taken = [p for p in [out / "ca", *(out / c for c in spec.names())] if p.exists()]
        if taken:
            raise SecurityError(f"{taken[0]} already exists; provision into a new --out directory or remove it first")
        state = {"federation": spec.federation, "revision": 0, "clusters": {}, "removed": {},
                 "ca": str(Path(ca_dir).resolve()) if ca_dir else "ca"}
    elif fresh:
        new = [c for c in spec.names() if c not in state["clusters"]]
        raise SecurityError(f"{out} already exists and holds {_held(out, state)}; provision into a new --out "
                            f"directory, or {_alternatives(out, new)}")
    elif state["federation"] != spec.federation:
        raise FederationError(f"{out} holds federation {state['federation']}, the file describes "
                              f"{spec.federation}; provision it into another --out directory")
    gone = [c for c in state["clusters"] if c not in spec.names()]
    if gone:
        raise FederationError(f"{out} holds cluster {gone[0]}, which the federation file no longer lists; take it "
                              f"out with `nebula-admin provision remove-cluster {gone[0]} --out {out}` (revokes it), "
                              "or list it again")
    spec = _resolve_ports(spec)
    ca_path = out / state["ca"] if not Path(state["ca"]).is_absolute() else Path(state["ca"])
    passphrase = _passphrase(spec, ca_passphrase)
    out.mkdir(parents=True, exist_ok=True)
    ca = None
    if ca_path.exists():
        ca = CertificateAuthority.open(ca_path, passphrase)
        if ca.federation != spec.federation:
            raise CAError(f"CA {ca_path} belongs to federation {ca.federation!r}, not {spec.federation!r}; "
                          "pass the matching --federation or another --ca")
        ca.key  # a wrong passphrase fails here, before anything is written
    new = [c for c in spec.clusters if c.name not in state["clusters"]]
    revision = state["revision"] + 1
    stage = Path(tempfile.mkdtemp(dir=out, prefix=".provision-"))
    try:
        if ca is None:
            ca = CertificateAuthority.init(stage / "ca", spec.federation, passphrase, days=spec.ca.days)
        kits = {c.name: build_kit(ca, spec, c, stage / c.name, os.path.relpath(ca_path, out / c.name), revision)
                for c in new}
        if (stage / "ca").exists():
            os.replace(stage / "ca", out / "ca")
            ca = CertificateAuthority.open(out / "ca", passphrase)
        for c in new:
            os.replace(stage / c.name, out / c.name)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    ca.write_crl(days=spec.ca.crl_days)
    changed = [c for c in spec.clusters if c not in new and set_peers(spec, c, out / c.name, revision)]
    if not new and not changed:
        revision -= 1
    for name, kit in kits.items():
        state["clusters"][name] = {"serials": [format_serial(s) for s in kit.serials], "since": revision}
    state["revision"] = revision
    return _finish(out, spec, state, ca, changed, f"federation.provision r{revision}",
                   {"added": [c.name for c in new], "updated": [c.name for c in changed]})


def _worker_certs(d: Path, cluster: SiteSpec) -> dict[str, Path]:
    """Kit path -> file of each worker certificate in kit directory `d` of `cluster`."""
    return {f"{WORKERS_DIR}/{name}.pem": d / WORKERS_DIR / f"{name}.pem" for _, name in cluster.worker_names()}


def _certificates(d: Path, cluster: SiteSpec) -> dict[str, bytes]:
    """The certificates an update carries for `cluster` (kit directory `d`): its switch's and its workers'."""
    return {CERT_FILE: (d / CERT_FILE).read_bytes(),
            **{name: path.read_bytes() for name, path in _worker_certs(d, cluster).items()}}


def _finish(out: Path, spec: FederationSpec, state: dict, ca: CertificateAuthority, changed: list[SiteSpec],
            action: str, detail: dict) -> dict:
    """Write the federation file and state, the kits' archives and the peers updates of `changed`; the summary."""
    atomic_write(out / SPEC, (f"# federation {spec.federation} as provisioned (revision {state['revision']}); edit "
                              f"and run `nebula-admin provision --from {SPEC} --out .` here to change it\n"
                              + yaml.safe_dump(federation_doc(spec), sort_keys=False)).encode(), PUBLIC)
    atomic_write(out / STATE, json.dumps(state, indent=1, sort_keys=True).encode())
    for c in spec.clusters:  # (each kit as it is now: its files, revision, peers and the current CRL's number)
        seal_kit(ca, out / c.name, spec.federation, c.name, read_doc(out / c.name / KIT_FILE, "kit file")["revision"],
                 [p.name for p in spec.clusters if p.name != c.name])
    kits = {c.name: archive(out / c.name, out / "kits" / f"{c.name}.tar.gz") for c in spec.clusters}
    # (every update carries the site's certificates as they are here, renewed or not: the site's kit check accepts
    # the ones its latest update signs)
    updates = {c.name: write_update(ca, spec, c, out / "updates" / f"{c.name}-r{state['revision']}.tar.gz",
                                    state["revision"], _certificates(out / c.name, c)) for c in changed}
    ca.audit_event(action.split()[0], spec.federation, detail={"revision": state["revision"], **detail})
    clusters = {}
    for c in spec.clusters:
        d = (out / c.name).resolve()
        worker = worker_file(c.worker_names()[0][1])
        # (dir, switch_yaml, worker_yaml: the admin's copy here; site_*: as the kit is unpacked at the site)
        clusters[c.name] = {"dir": str(d), "switch_yaml": str(d / "switch.yaml"), "worker_yaml": str(d / worker),
                            "site_switch_yaml": f"{c.name}/switch.yaml", "site_worker_yaml": f"{c.name}/{worker}",
                            "listen": c.address, "endpoint": c.local, "kit": str(kits[c.name].resolve())}
    return {"federation": spec.federation, "ca": str(ca.dir.resolve()), "revision": state["revision"],
            "signer": key_fingerprint(ca.cert.public_key()),
            "clusters": clusters, "updates": {k: str(v.resolve()) for k, v in updates.items()},
            "removed": sorted(state["removed"])}


def provision(federation: str, clusters: Sequence[str], out: str | os.PathLike, host: str = "127.0.0.1",
              ca_dir: str | os.PathLike | None = None, account: str = "nebula",
              ca_passphrase: str | bytes | None = None) -> dict:
    """The quick case: `clusters` of `federation`, every switch on `host` (free ports of this machine), one worker
    credential of `account` each, into the new directory `out` (its CA, unless `ca_dir` names one)."""
    check_name(federation, "federation")
    check_name(account, "account")
    clusters = [check_name(c, "cluster") for c in clusters]
    if not clusters:
        raise SecurityError("no clusters given; pass --clusters A,B")
    if len(set(clusters)) != len(clusters):
        raise SecurityError(f"clusters {','.join(clusters)} name a cluster twice; give each once")
    if ca_dir is not None:  # (checked before anything is written, as below)
        ca = CertificateAuthority.open(ca_dir, ca_passphrase)
        if ca.federation != federation:
            raise CAError(f"CA {ca_dir} belongs to federation {ca.federation!r}, not {federation!r}; "
                          "pass the matching --federation or another --ca")
    out = Path(out)
    if _load_state(out) is None and (out / "ca").exists() and ca_dir is None:
        raise SecurityError(f"{out / 'ca'} already exists; provision into a new --out directory or remove it first")
    ports = [0] * len(clusters) if is_loopback(host) else free_ports(host, len(clusters))
    # where workers reach the switch: `local`, and beside it a TLS endpoint for workers on other hosts
    drawn = free_ports("127.0.0.1", 2 * len(clusters)) if not is_loopback(host) else [0] * (2 * len(clusters))
    local, tls = drawn[:len(clusters)], drawn[len(clusters):]
    addr = f"[{host}]" if ":" in host else host
    spec = FederationSpec(federation, tuple(
        SiteSpec(c, host, p, f"{addr}:{p}", f"tcp://127.0.0.1:{lp}", (AccountSpec(account),),
                    local_tls=f"127.0.0.1:{tp}")
        for c, p, lp, tp in zip(clusters, ports, local, tls)), CASpec())
    return provision_spec(spec, out, ca_dir, ca_passphrase, fresh=True)


def _spec_of(out: Path) -> tuple[FederationSpec, dict]:
    state = _load_state(out)
    if state is None:
        raise SecurityError(f"{out} holds no provisioned federation ({STATE} is missing); provision one with "
                            f"`nebula-admin provision --from federation.yaml --out {out}`")
    return load_federation(out / SPEC), state


def add_cluster(out: str | os.PathLike, name: str, host: str = "127.0.0.1", port: int = 0, *,
                listen: str | None = None, local: str | None = None, accounts: Sequence[AccountSpec] = (),
                ca_passphrase: str | bytes | None = None) -> dict:
    """Add cluster `name` at `host:port` to the federation in `out`: its kit, and a peers update for every other."""
    out = Path(out)
    if not port and not is_loopback(host):
        raise FederationError(f"add-cluster {name}: --host {host} is not this machine's loopback, so a free port "
                              "here means nothing there; pass --port PORT (the WAN port its switch listens on)")
    spec, _ = _spec_of(out)
    doc = federation_doc(spec)
    entry: dict[str, Any] = {"name": name, "host": host, "port": port}
    if listen:
        entry["listen"] = listen
    if local:
        entry["local"] = local
    if accounts:
        entry["accounts"] = [{"name": a.name, "workers": list(a.workers)} for a in accounts]
    if name in spec.names():
        raise FederationError(f"federation {spec.federation} has a cluster {name} already; pick another name")
    doc["clusters"].append(entry)
    return provision_spec(parse_federation(doc, f"add-cluster {name}"), out, ca_passphrase=ca_passphrase)


def remove_cluster(out: str | os.PathLike, name: str, ca_passphrase: str | bytes | None = None,
                   reason: str = "cessation_of_operation") -> dict:
    """Take cluster `name` out of the federation in `out`: revoke its certificates (CRL), a peers update for every
    other site; its directory stays (its logs are the site's history), its kit archive goes."""
    out = Path(out)
    spec, state = _spec_of(out)
    gone = spec.cluster(name)
    rest = [c for c in spec.clusters if c.name != name]
    if not rest:
        raise FederationError(f"{name} is the last cluster of federation {spec.federation}; nothing would be left")
    ca_path = out / state["ca"] if not Path(state["ca"]).is_absolute() else Path(state["ca"])
    ca = CertificateAuthority.open(ca_path, _passphrase(spec, ca_passphrase))
    revoked = {format_serial(r.serial) for r in ca.list() if r.status == "revoked"}
    for serial in state["clusters"][name]["serials"]:
        if serial not in revoked:
            ca.revoke(serial, reason)
    ca.write_crl(days=spec.ca.crl_days)
    spec = spec.with_clusters(rest)
    state["revision"] += 1
    state["removed"][name] = state["revision"]
    del state["clusters"][name]
    for c in rest:
        set_peers(spec, c, out / c.name, state["revision"])
    (out / "kits" / f"{gone.name}.tar.gz").unlink(missing_ok=True)
    return _finish(out, spec, state, ca, rest, "federation.remove_cluster", {"cluster": name})


def _ca_of(out: Path, spec: FederationSpec, state: dict, passphrase: str | bytes | None) -> CertificateAuthority:
    ca_path = out / state["ca"] if not Path(state["ca"]).is_absolute() else Path(state["ca"])
    return CertificateAuthority.open(ca_path, _passphrase(spec, passphrase))


def _csr_for_renewal(path: Path, cluster: str, current: x509.Certificate) -> None:
    """Check CSR `path` asks for `cluster`'s switch certificate for the key it holds now; CAError naming it."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CAError(f"CSR {path} for {cluster} cannot be read ({exc.strerror}); make it on {cluster} with "
                      "`nebula-switch csr --config switch.yaml --out req.pem` and pass --csr "
                      f"{cluster}=req.pem") from None
    csr, cn = read_csr(data, path)  # (its signature: the requester holds the key)
    ident = identity_of(current)
    try:
        uris = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
            x509.UniformResourceIdentifier)
    except x509.ExtensionNotFound:
        uris = []
    if cn != ident.name or any(u != ident.uri for u in uris):
        raise CAError(f"CSR {path} asks for {', '.join(uris) or cn!r}, not {cluster}'s switch ({ident.uri}); make it "
                      f"on {cluster} with `nebula-switch csr --config switch.yaml --out req.pem`")
    if csr.public_key().public_numbers() != current.public_key().public_numbers():
        raise CAError(f"CSR {path} holds another key than {cluster}'s switch certificate; its kit seals that key, so "
                      "make the CSR from it (`nebula-switch csr --config switch.yaml`), or give the site a new kit "
                      "(remove-cluster, add-cluster) to change keys")


def renew(out: str | os.PathLike, *, margin_days: float | None = None, renew_all: bool = False,
          csrs: dict[str, str | os.PathLike] | None = None, crl_margin_days: float | None = None,
          ca_passphrase: str | bytes | None = None) -> dict:
    """Keep the federation in `out` within its lifetimes, as a signed update for every site: a fresh CRL (CRL number
    up) and, renewed for the key each site holds, every switch and worker certificate with less than `margin_days`
    left (default a third of its lifetime; `renew_all`: all of them; `csrs`: cluster -> CSR the site made with its
    switch's key).
    Nothing due (no certificate, no CSR, and the CRL's next update more than `crl_margin_days` away, default half
    its lifetime): nothing is written and the summary says `nothing_due`. Safe to run from cron."""
    out = Path(out)
    spec, state = _spec_of(out)
    csrs = {k: Path(v) for k, v in (csrs or {}).items()}
    for name in csrs:
        spec.cluster(name)  # (FederationError naming the known clusters)
    cert_days = spec.ca.cert_days or DEFAULT_DAYS["switch"]
    margin = cert_days / 3 if margin_days is None else margin_days
    crl_margin = spec.ca.crl_days / 2 if crl_margin_days is None else crl_margin_days
    for what, value in (("--margin-days", margin), ("--crl-margin-days", crl_margin)):
        if not value >= 0:
            raise FederationError(f"{what} {value} must be a number of days >= 0")
    ca = _ca_of(out, spec, state, ca_passphrase)
    ca.key  # a wrong passphrase fails here, before anything is written
    now = utcnow()
    current = {c.name: x509.load_pem_x509_certificate((out / c.name / CERT_FILE).read_bytes()) for c in spec.clusters}
    workers = {(c.name, path.stem): (path, x509.load_pem_x509_certificate(path.read_bytes()))
               for c in spec.clusters for path in _worker_certs(out / c.name, c).values()}

    def near(cert: x509.Certificate) -> bool:
        return renew_all or (cert.not_valid_after_utc - now).total_seconds() < margin * 86400

    due = [c for c in spec.clusters if c.name in csrs or near(current[c.name])]
    workers_due = sorted(k for k, (_, cert) in workers.items() if near(cert))
    for c in due:
        if c.name in csrs:
            _csr_for_renewal(csrs[c.name], c.name, current[c.name])
    try:
        crl_next = x509.load_pem_x509_crl(ca.crl_path.read_bytes()).next_update_utc
    except (OSError, ValueError):
        crl_next = None  # (unreadable: write a fresh one)
    crl_due = crl_next is None or (crl_next - now).total_seconds() < crl_margin * 86400
    if not due and not workers_due and not crl_due:
        return {"federation": spec.federation, "nothing_due": True, "revision": state["revision"],
                "crl_next_update": iso(crl_next), "margin_days": margin, "crl_margin_days": crl_margin,
                "next_expiry": {**{n: iso(c.not_valid_after_utc) for n, c in current.items()},
                                **{f"{n}/{w}": iso(c.not_valid_after_utc) for (n, w), (_, c) in workers.items()}}}
    ca.write_crl(days=spec.ca.crl_days)
    renewed = {}
    for c in due:
        old = current[c.name]
        new = ca.renew(old.serial_number, cert_days, out=out / c.name / CERT_FILE)
        cert = ca.certificate(new.serial)
        renewed[c.name] = {"serial": format_serial(new.serial), "old_serial": format_serial(old.serial_number),
                           "not_after": iso(cert.not_valid_after_utc), "csr": str(csrs[c.name]) if c.name in csrs
                           else None}
        # (the old certificate stays valid until it expires: live sessions made with it go on; both are revoked
        # should the cluster leave)
        state["clusters"][c.name]["serials"].append(format_serial(new.serial))
        ca.audit_event("federation.renew_certificate", c.name, detail=renewed[c.name])
    renewed_workers: dict[str, dict] = {}
    for name, worker in workers_due:
        path, old = workers[(name, worker)]
        new = ca.renew(old.serial_number, cert_days, out=path)
        done = {"serial": format_serial(new.serial), "old_serial": format_serial(old.serial_number),
                "not_after": iso(ca.certificate(new.serial).not_valid_after_utc)}
        renewed_workers.setdefault(name, {})[worker] = done
        state["clusters"][name]["serials"].append(format_serial(new.serial))
        ca.audit_event("federation.renew_certificate", f"{name}/{worker}", detail=done)
    state["revision"] += 1
    for c in spec.clusters:
        d = out / c.name
        dump_yaml(d / KIT_FILE, {**read_doc(d / KIT_FILE, "kit file"), "revision": state["revision"]})
    crl = x509.load_pem_x509_crl(ca.crl_path.read_bytes())
    summary = _finish(out, spec, state, ca, list(spec.clusters), "federation.renew",
                      {"renewed": sorted(renewed), "renewed_workers": [f"{n}/{w}" for n, w in workers_due],
                       "crl_next_update": iso(crl.next_update_utc)})
    return {**summary, "nothing_due": False, "renewed": renewed, "renewed_workers": renewed_workers,
            "crl_next_update": iso(crl.next_update_utc)}
