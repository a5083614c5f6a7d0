"""Peers updates: what the admin sends a site already running when the federation changes, and how a site takes one.

An update is a small archive: `update.yaml` (the site's peers at a new revision, and its own listen address), the
CA's current `crl.pem`, the site's switch certificate and its workers' as the admin holds them now (`switch.pem`,
`workers/<name>.pem`: renewed by `nebula-admin provision renew` before they expire, for the keys the site holds), and
`update.sig`, the CA key's signature
over the files' sha256 and what they bind (federation, cluster, revision, CRL number, peers; `security.signing`).
`check_update` refuses, before anything is written, an update that is unsigned, signed by another key, altered, for
another site, not above the revision in force, or whose CRL is not the CA's or older (by its CRL Number) than the one
in place, a certificate that is not the CA's for this cluster's switch (or the named worker of it) and the key it
holds, and a hostile archive
(links, `..` paths, stray or missing or oversized members, YAML bombs); `install_update` then writes it into the kit and
keeps the signed update there (`applied-update.json`) for the switch's own check at start and reload.
"""
from __future__ import annotations

import datetime as dt
import gzip
import io
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.exceptions import InvalidSignature

from security._files import PUBLIC, atomic_write
from security._yaml import YamlError, check_keys, parse_yaml
from security.errors import IdentityError, SecurityError
from security.federation import SiteSpec, FederationSpec
from security.identity import identity_of
from security.kit_seal import (APPLIED_UPDATE, CERT_FILE, KIT_FILE, KitError, applied_record, ca_certificate, check_kit,
                               crl_number_at, is_renewable, worker_cert_name)
from security.kits import dump_yaml, peers_of, read_doc
from security.signing import SignatureError, Statement, crl_number, sha256_hex, sign_statement, verify_statement

__all__ = ["CERT_FILE", "CRL_FILE", "MAX_UPDATE_BYTES", "PendingUpdate", "SIG_FILE", "UPDATE_FILE", "UpdateError",
           "apply_update", "check_update", "install_update", "write_update"]

UPDATE_FILE = "update.yaml"
CRL_FILE = "crl.pem"
SIG_FILE = "update.sig"
MEMBERS = (UPDATE_FILE, CRL_FILE, SIG_FILE)
OPTIONAL = (CERT_FILE,)
MAX_UPDATE_BYTES = 1 << 20  # the archive and each member: an update is a few KiB
MAX_INFLATED_BYTES = 4 * MAX_UPDATE_BYTES  # the members with their tar headers, inflated


class UpdateError(SecurityError):
    """A peers update is refused; the message names the archive, the problem and the fix, `reason` a short code
    for the audit record (unsigned, bad_signature, altered, other_site, old_revision, old_crl, malformed, kit)."""

    def __init__(self, message: str, reason: str = "malformed") -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class PendingUpdate:
    """A peers update that passed every check, not yet written: where it goes and what it brings."""

    config: Path
    update: Path
    statement: Statement
    signer: str
    renewed: str | None  # the new switch certificate's serial and expiry when the update renews it, else None
    peers: tuple[dict, ...]  # update.yaml's peers, as switch.yaml takes them
    listen: str | None
    files: dict  # member name -> bytes
    switch_doc: dict  # switch.yaml as it is now
    crl_path: Path
    revoked: int
    before: tuple[int, int]  # (revision, CRL number) in force before it
    workers_renewed: tuple[str, ...] = ()  # the workers whose certificates it renews

    def audit_detail(self) -> dict[str, Any]:
        """What the audit record of this update says: who signed which revision and CRL number."""
        return {"signer": self.signer, "revision": self.statement.revision, "crl_number": self.statement.crl_number,
                **({"certificate": self.renewed} if self.renewed else {}),
                **({"worker_certificates": list(self.workers_renewed)} if self.workers_renewed else {}),
                "peers": list(self.statement.peers), "previous_revision": self.before[0],
                "previous_crl_number": self.before[1], "update_sha256": sha256_hex(self.files[UPDATE_FILE])}


def write_update(ca: Any, spec: FederationSpec, cluster: SiteSpec, dest: Path, revision: int,
                 certificates: dict[str, bytes] | None = None) -> Path:
    """The signed peers update of an existing site at `revision`: its peers now, the CA's (`ca`) current CRL and
    `certificates` (kit path -> PEM: `switch.pem` and `workers/<name>.pem` as the admin holds them now)."""
    certificates = dict(certificates or {})
    stray = [n for n in certificates if not is_renewable(n)]
    if stray:
        raise ValueError(f"{stray[0]!r} is not a certificate an update renews ({CERT_FILE}, workers/<name>.pem)")
    doc = {"federation": spec.federation, "cluster": cluster.name, "revision": revision, "listen": cluster.listen,
           "peers": peers_of(spec, cluster)}
    text = yaml.safe_dump(doc, sort_keys=False).encode()
    crl = ca.crl_path.read_bytes()
    files = {UPDATE_FILE: text, CRL_FILE: crl, **certificates}
    statement = Statement("peers_update", spec.federation, cluster.name, revision,
                          crl_number(x509.load_pem_x509_crl(crl)), tuple(p["cluster"] for p in doc["peers"]),
                          tuple(sorted((name, sha256_hex(data)) for name, data in files.items())))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        signature = sign_statement(statement, ca.cert, ca.key)
        for name, data in (*files.items(), (SIG_FILE, signature)):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return atomic_write(dest, buf.getvalue(), PUBLIC)


def _members(path: Path) -> dict[str, bytes]:
    """The files of update archive `path`: update.yaml, crl.pem and update.sig, optionally certificates (switch.pem,
    workers/<name>.pem), each once, regular and small."""
    try:
        if path.stat().st_size > MAX_UPDATE_BYTES:
            raise UpdateError(f"{path} is larger than a peers update can be ({MAX_UPDATE_BYTES} bytes); is it a kit?")
        # inflate within bounds first: tarfile reads a pax or long-name header whole, whatever its size, before
        # any member check could refuse it (a 1 MiB archive can inflate to a gigabyte)
        with gzip.open(path, "rb") as gz:
            raw = gz.read(MAX_INFLATED_BYTES + 1)
        if len(raw) > MAX_INFLATED_BYTES:
            raise UpdateError(f"{path} inflates to more than {MAX_INFLATED_BYTES} bytes; a peers update is a few "
                              "kilobytes: ask the admin for the update again")
        out: dict[str, bytes] = {}
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tar:
            for info in tar:
                if (info.name not in MEMBERS + OPTIONAL and worker_cert_name(info.name) is None) \
                        or not info.isfile() or info.name in out:
                    what = "a link" if info.issym() or info.islnk() else "a second copy" if info.name in out else ""
                    raise UpdateError(f"{path} holds {info.name[:100]!r}{' (' + what + ')' if what else ''}; a peers "
                                      f"update holds only {', '.join(MEMBERS + OPTIONAL)} and workers/<name>.pem, "
                                      "each once (is it a kit? "
                                      "extract a kit with tar instead)")
                if info.size > MAX_UPDATE_BYTES:
                    raise UpdateError(f"{path}: its {info.name} is larger than {MAX_UPDATE_BYTES} bytes; ask the "
                                      "admin for the update again")
                out[info.name] = tar.extractfile(info).read()
    except (OSError, tarfile.TarError, EOFError, ValueError, zlib.error) as exc:
        raise UpdateError(f"{path} is not a peers update archive ({type(exc).__name__}: {str(exc)[:120]}); use "
                          "the updates/<cluster>-r<N>.tar.gz that `nebula-admin provision` wrote") from None
    if SIG_FILE not in out and UPDATE_FILE in out:
        raise UpdateError(f"{path} is not signed (it holds no {SIG_FILE}); every peers update is signed by the "
                          "federation's CA: ask the admin for the update `nebula-admin provision` wrote",
                          "unsigned")
    missing = [m for m in MEMBERS if m not in out]
    if missing:
        raise UpdateError(f"{path} lacks {' and '.join(missing)}; ask the admin for the update again")
    return out


def _update_doc(data: bytes, where: str) -> dict[str, Any]:
    """update.yaml, parsed within bounds and checked key by key."""
    try:
        doc = parse_yaml(data, where)
        check_keys(doc, UPDATE_FILE, {"federation": str, "cluster": str, "revision": int, "listen": str,
                                      "peers": list}, required=("federation", "cluster", "revision", "peers"))
        for i, p in enumerate(doc["peers"]):
            check_keys(p, f"peers[{i}]", {"cluster": str, "address": str, "accounts": list},
                       required=("cluster", "address"))
    except YamlError as exc:
        raise UpdateError(f"{where} is unusable ({exc}); ask the admin for the update again") from None
    return doc


def _incoming_crl(data: bytes, ca: x509.Certificate, where: str) -> x509.CertificateRevocationList:
    """The update's CRL, if the CA signed it and it is not past its next update."""
    try:
        crl = x509.load_pem_x509_crl(data)
    except ValueError as exc:
        raise UpdateError(f"{where} is not a PEM CRL ({exc}); ask the admin for the update again") from None
    if not crl.is_signature_valid(ca.public_key()):
        raise UpdateError(f"{where} is not signed by this kit's CA; ask the admin for a fresh update", "bad_signature")
    nxt = crl.next_update_utc
    if nxt is not None and nxt < dt.datetime.now(dt.timezone.utc):
        raise UpdateError(f"{where} expired at {nxt:%Y-%m-%dT%H:%M:%SZ}; ask the admin for a fresh update "
                          "(`nebula-admin provision renew --out DIR` writes one for every site)", "old_crl")
    return crl


def _incoming_cert(data: bytes, ca: x509.Certificate, current: Path, federation: str, cluster: str,
                   where: str, worker: str | None = None) -> tuple[x509.Certificate, bool]:
    """(the update's certificate, whether it differs from the one in place) if the CA issued it to this cluster's
    switch (or to its worker `worker`), for the key of the certificate in place (`current`), and it is valid now."""
    try:
        cert = x509.load_pem_x509_certificate(data)
    except ValueError as exc:
        raise UpdateError(f"{where} is not a PEM certificate ({exc}); ask the admin for the update again") from None
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        raise UpdateError(f"{where} is not issued by this kit's CA; ask the admin for a fresh update",
                          "bad_signature") from None
    try:
        ident = identity_of(cert)
    except IdentityError as exc:
        raise UpdateError(f"{where} carries no valid identity ({exc}); ask the admin for the update again",
                          "other_site") from None
    role, name = ("switch", ident.name) if worker is None else ("worker", worker)
    if (ident.federation, ident.role, ident.cluster, ident.name) != (federation, role, cluster, name):
        what = "a switch certificate" if worker is None else f"worker {worker}'s certificate"
        raise UpdateError(f"{where} is {ident.uri}, not {what} of cluster {cluster} of {federation}; apply "
                          f"{cluster}'s own update", "other_site")
    try:
        now_cert = x509.load_pem_x509_certificate(current.read_bytes())
    except (OSError, ValueError) as exc:
        raise UpdateError(f"{where} not applied: the certificate in place {current} cannot be read ({exc}); get "
                          "the kit again from the admin", "kit") from None
    if cert.public_key().public_numbers() != now_cert.public_key().public_numbers():
        fix = ("(`nebula-switch csr`, then the admin's `provision renew --csr`)" if worker is None else
               "(the admin's `provision renew` renews the key the kit holds)")
        raise UpdateError(f"{where} is for another key than the one in place ({current}); renew it for this key "
                          f"{fix}", "other_site")
    now = dt.datetime.now(dt.timezone.utc)
    if not cert.not_valid_before_utc <= now < cert.not_valid_after_utc:
        raise UpdateError(f"{where} is valid {cert.not_valid_before_utc:%Y-%m-%dT%H:%M:%SZ} to "
                          f"{cert.not_valid_after_utc:%Y-%m-%dT%H:%M:%SZ}, not now; ask the admin for a fresh update",
                          "old_crl")
    return cert, cert.serial_number != now_cert.serial_number


def check_update(config: Path, update: Path) -> PendingUpdate:
    """Every check of peers update `update` for the kit of switch.yaml `config`; nothing is written. UpdateError
    of one line (naming the archive, the problem and the fix) for any refusal."""
    config, update = Path(config), Path(update)
    files = _members(update)
    try:
        sw = read_doc(config, "switch config")
    except SecurityError as exc:
        raise UpdateError(str(exc)) from None
    base = config.resolve().parent
    tls = sw.get("tls") if isinstance(sw.get("tls"), dict) else {}
    ca_path, crl_path = base / str(tls.get("ca", "ca.pem")), base / str(tls.get("crl", "crl.pem"))
    try:
        ca = ca_certificate(ca_path)
        statement, signer = verify_statement(files[SIG_FILE], ca, "peers_update", f"{update}: {SIG_FILE}")
    except KitError as exc:
        raise UpdateError(str(exc), "kit") from None
    except SignatureError as exc:
        raise UpdateError(str(exc), "bad_signature") from None
    signed = {name for name, _ in statement.files}
    if {n for n in signed if not is_renewable(n)} != {UPDATE_FILE, CRL_FILE}:
        raise UpdateError(f"{update}: {SIG_FILE} signs {', '.join(n for n, _ in statement.files)[:200]}, not "
                          f"{UPDATE_FILE} and {CRL_FILE} (and optionally certificates); ask the admin for the update "
                          "again", "altered")
    for name in (UPDATE_FILE, CRL_FILE, *sorted(n for n in signed | set(files) if is_renewable(n))):
        if name not in signed and name not in files:
            continue
        if name not in signed or name not in files:
            raise UpdateError(f"{update}: its {name} is {'not signed' if name in files else 'missing'} although "
                              f"{SIG_FILE} {'signs it' if name in signed else 'does not'}: it was altered after the "
                              "admin signed it; use only the update the admin sent", "altered")
        if statement.file_hash(name) != sha256_hex(files[name]):
            raise UpdateError(f"{update}: its {name} was altered after the admin signed it ({SIG_FILE}); use only "
                              "the update the admin sent", "altered")
    mine = (sw.get("federation"), sw.get("cluster"))
    if (statement.federation, statement.cluster) != mine:
        raise UpdateError(f"{update} is for cluster {statement.cluster} of federation {statement.federation}, this "
                          f"switch ({config}) is {mine[1]} of {mine[0]}; apply {mine[1]}'s own update", "other_site")
    doc = _update_doc(files[UPDATE_FILE], f"{update}: {UPDATE_FILE}")
    names = tuple(p["cluster"] for p in doc["peers"])
    if (doc["federation"], doc["cluster"], doc["revision"], names) != \
            (statement.federation, statement.cluster, statement.revision, statement.peers):
        raise UpdateError(f"{update}: {UPDATE_FILE} says other than {SIG_FILE} (federation, cluster, revision or "
                          "peers); ask the admin for the update again", "altered")
    # (peers the update itself signs are let through: a kit cut short after switch.yaml takes the same update again)
    peers_now = [c for p in sw.get("peers") or [] if isinstance(p, dict)
                 and (c := p.get("cluster")) not in statement.peers]
    try:
        state = check_kit(config, federation=str(mine[0]), cluster=str(mine[1]), ca_path=ca_path, crl_path=crl_path,
                          peers=peers_now, check_crl=False)
    except KitError as exc:
        raise UpdateError(f"{update} not applied: {exc}", "kit") from None
    if state is None:
        raise UpdateError(f"{update} not applied: {config} is not in a kit the admin signed (no kit.sig beside it); "
                          "get this site's kit from the admin (`nebula-admin provision`)", "kit")
    revision = state.revision  # (the signed one: kit.yaml only repeats it for people)
    if statement.revision <= revision:
        raise UpdateError(f"{update} is revision {statement.revision}, this kit is at revision {revision} already; "
                          "apply only a newer update (the highest -r<N> the admin sent)", "old_revision")
    crl = _incoming_crl(files[CRL_FILE], ca, f"{update}: {CRL_FILE}")
    number, in_place = crl_number(crl), max(crl_number_at(crl_path, ca), state.crl_number)
    if number != statement.crl_number:
        raise UpdateError(f"{update}: its CRL is number {number}, its {SIG_FILE} says {statement.crl_number}; ask "
                          "the admin for the update again", "altered")
    if number < in_place:
        raise UpdateError(f"{update} carries CRL number {number}, older than number {in_place} in force here; "
                          "apply only the admin's latest update", "old_crl")
    renewed = None
    if CERT_FILE in files:
        cert, new = _incoming_cert(files[CERT_FILE], ca, base / CERT_FILE, str(mine[0]), str(mine[1]),
                                   f"{update}: {CERT_FILE}")
        if new:
            renewed = f"serial {cert.serial_number:x} until {cert.not_valid_after_utc:%Y-%m-%dT%H:%M:%SZ}"
    workers_renewed = _incoming_worker_certs(files, sw, ca, base, str(mine[0]), str(mine[1]), update)
    listen = doc.get("listen")
    return PendingUpdate(config, update, statement, signer, renewed, tuple(doc["peers"]),
                         listen if listen and listen != sw.get("listen") else None, files, sw, crl_path,
                         len(crl), (revision, in_place), workers_renewed)


def _incoming_worker_certs(files: dict[str, bytes], sw: dict, ca: x509.Certificate, base: Path, federation: str,
                           cluster: str, update: Path) -> tuple[str, ...]:
    """The workers whose certificates the update renews, once each is checked: a worker this switch serves (its
    switch.yaml's `local.workers`), the CA's certificate for it, for the key its kit holds, valid now."""
    local = sw.get("local") if isinstance(sw.get("local"), dict) else {}
    served = {w.get("name") for w in local.get("workers") or [] if isinstance(w, dict)}
    renewed = []
    for member in sorted(files):
        worker = worker_cert_name(member)
        if worker is None:
            continue
        if worker not in served:
            raise UpdateError(f"{update}: {member} is for worker {worker!r}, which this switch does not serve "
                              f"({len(served)} worker(s) in its switch.yaml); apply this site's own update",
                              "other_site")
        _, new = _incoming_cert(files[member], ca, base / member, federation, cluster, f"{update}: {member}", worker)
        if new:
            renewed.append(worker)
    return tuple(renewed)


def install_update(p: PendingUpdate) -> str:
    """Write checked update `p` into its kit: CRL, switch.yaml's peers (and listen), then the signed update itself
    (a kit cut short before it refuses to start with the update's peers, and takes the same update again) and
    kit.yaml's revision. What changed, in one line."""
    base = p.config.resolve().parent
    if p.crl_path.is_symlink():
        p.crl_path.unlink()
    atomic_write(p.crl_path, p.files[CRL_FILE], PUBLIC)
    for name in sorted(n for n in p.files if is_renewable(n)):
        # (before the record that vouches for them: a kit cut short takes the update again)
        atomic_write(base / name, p.files[name], PUBLIC)
    dump_yaml(p.config, {**p.switch_doc, "peers": [dict(x) for x in p.peers],
                         **({"listen": p.listen} if p.listen else {})})
    atomic_write(base / APPLIED_UPDATE, applied_record(p.files[UPDATE_FILE], p.files[SIG_FILE]), PUBLIC)
    kit = read_doc(base / KIT_FILE, "kit file") if (base / KIT_FILE).exists() else {}
    dump_yaml(base / KIT_FILE, {**kit, "revision": p.statement.revision})
    peers = ", ".join(f"{x['cluster']} {x['address']}" for x in p.peers) or "none"
    restart = f"; this switch now listens on {p.listen}: restart it to bind there" if p.listen else ""
    renewed = f"; certificate renewed ({p.renewed})" if p.renewed else ""
    if p.workers_renewed:
        renewed += f"; worker certificate(s) renewed: {', '.join(p.workers_renewed)}"
    return (f"revision {p.statement.revision}: peers {peers}; CRL number {p.statement.crl_number} revokes "
            f"{p.revoked} certificate(s){renewed}; signed by the CA key {p.signer[:23]}...{restart}")


def apply_update(config: Path, update: Path) -> str:
    """`check_update`, then `install_update`: what changed (one line), or UpdateError with nothing written."""
    return install_update(check_update(config, update))
