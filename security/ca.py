"""Certificate authority of a federation: ECDSA P-256 root, issuance by role, CSR signing, renewal, revocation, CRL.

Layout of a CA directory: `ca.pem` (root certificate), `ca.key` (0600, optionally encrypted), `crl.pem`,
`index.db` (SQLite: every issued certificate and its status), `certs/<serial>.pem` (copies of issued
certificates), `audit.log` + `audit_signing.key` (every CA operation is one audit record).
"""
from __future__ import annotations

import datetime as dt
import logging
import os
import sqlite3
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from security._files import PUBLIC, atomic_write, read_file
from security.audit import AuditLog, default_actor, generate_signing_key
from security._time import iso
from security.certbuild import (CA_DAYS, CRL_DAYS, DEFAULT_DAYS, REVOCATION_REASONS, csr_for, format_serial,
                                leaf_certificate, now, parse_serial, private_key_pem, read_csr, revocation_list,
                                root_certificate)
from security.errors import CAError, IdentityError
from security.identity import Identity, check_name, identity_of

__all__ = [
    "CertificateAuthority",
    "IssuedCert",
    "CertRecord",
    "REVOCATION_REASONS",
    "DEFAULT_DAYS",
    "parse_serial",
    "format_serial",
    "load_private_key",
    "make_csr",
    "csr_from_key",
]

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS certs (
    serial TEXT PRIMARY KEY,
    identity TEXT NOT NULL,
    role TEXT NOT NULL,
    cluster TEXT,
    name TEXT NOT NULL,
    not_before TEXT NOT NULL,
    not_after TEXT NOT NULL,
    status TEXT NOT NULL DEFAULT 'valid',
    revoked_at TEXT,
    reason TEXT,
    renewed_from TEXT,
    pem TEXT NOT NULL
);
"""


def load_private_key(path: str | os.PathLike, passphrase: str | bytes | None, what: str = "private key"):
    """Load a PEM private key; wrong/missing passphrase and malformed files raise CAError naming the file."""
    data = read_file(path, what, CAError, "check the path")
    pw = passphrase.encode() if isinstance(passphrase, str) else passphrase
    try:
        return serialization.load_pem_private_key(data, password=pw)
    except TypeError:
        if pw is None:
            raise CAError(f"{what} {path} is encrypted; supply its passphrase (--passphrase-env VAR)") from None
        raise CAError(f"{what} {path} is not encrypted; drop the passphrase") from None
    except ValueError as exc:
        if pw is not None and b"ENCRYPTED" in data:
            raise CAError(f"wrong passphrase for {what} {path}; supply the passphrase it was created with") from None
        raise CAError(f"{what} {path} is not a valid PEM private key ({exc}); restore it from backup") from None


def _load_cert(path: Path, what: str) -> x509.Certificate:
    data = read_file(path, what, CAError, "check the path")
    try:
        return x509.load_pem_x509_certificate(data)
    except ValueError as exc:
        raise CAError(f"{what} {path} is not a valid PEM certificate ({exc})") from None


@dataclass(frozen=True, slots=True)
class IssuedCert:
    """Paths of a freshly issued certificate (and its key, when the CA generated it) and its serial."""

    cert_path: Path
    key_path: Path | None
    serial: int


@dataclass(frozen=True, slots=True)
class CertRecord:
    """One row of the CA index, as `cert list` shows it."""

    serial: int
    identity: str
    role: str
    cluster: str | None
    name: str
    not_before: str
    not_after: str
    status: str  # valid | revoked | expired
    reason: str | None
    revoked_at: str | None


class CertificateAuthority:
    """A federation's CA in a directory; open it with `init` (new) or `open` (existing)."""

    def __init__(self, directory: Path, cert: x509.Certificate, passphrase: str | bytes | None) -> None:
        self.dir = directory
        self.cert = cert
        self.index_path = directory / "index.db"  # SQLite index of issued certificates
        self.audit_path = directory / "audit.log"  # audit log of CA operations
        self._passphrase = passphrase
        self._key = None
        fed = cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)
        if not fed:
            raise CAError(f"{self.cert_path} has no organization (federation) in its subject; not a Nebula CA")
        self.federation = fed[0].value

    # ---- paths
    @property
    def cert_path(self) -> Path:
        """Root certificate (`ca.pem`)."""
        return self.dir / "ca.pem"

    @property
    def key_path(self) -> Path:
        """Root private key (`ca.key`)."""
        return self.dir / "ca.key"

    @property
    def crl_path(self) -> Path:
        """The CA's current CRL (`crl.pem`), rewritten on every revocation."""
        return self.dir / "crl.pem"

    # ---- construction
    @classmethod
    def init(cls, directory: str | os.PathLike, federation: str, passphrase: str | bytes | None = None,
             days: int = CA_DAYS) -> "CertificateAuthority":
        """Create a new CA in `directory` (must not already hold one): root key and certificate, empty CRL, index."""
        check_name(federation, "federation")
        directory = Path(directory)
        if (directory / "ca.pem").exists() or (directory / "ca.key").exists():
            raise CAError(f"{directory} already holds a CA; use a new --dir or open the existing one")
        directory.mkdir(parents=True, exist_ok=True)
        os.chmod(directory, 0o700)
        key = ec.generate_private_key(ec.SECP256R1())
        cert = root_certificate(key, federation, days)
        # key first: a directory with ca.pem but no ca.key would look like a broken CA
        atomic_write(directory / "ca.key", private_key_pem(key, passphrase))
        with closing(sqlite3.connect(directory / "index.db")) as db, db:
            db.executescript(_SCHEMA)
            db.execute("INSERT OR REPLACE INTO meta VALUES ('federation', ?)", (federation,))
        os.chmod(directory / "index.db", 0o600)
        if not (directory / "audit_signing.key").exists():
            generate_signing_key(directory / "audit_signing.key")
        atomic_write(directory / "ca.pem", cert.public_bytes(serialization.Encoding.PEM), PUBLIC)
        ca = cls(directory, cert, passphrase)
        ca._key = key
        ca._write_crl_to(ca.crl_path)
        ca.audit_event("ca.init", ca.cert_path.name,
                       detail={"federation": federation, "serial": format_serial(cert.serial_number),
                               "encrypted": bool(passphrase)})
        log.info("initialised CA for federation %s in %s", federation, directory)
        return ca

    @classmethod
    def open(cls, directory: str | os.PathLike, passphrase: str | bytes | None = None) -> "CertificateAuthority":
        """Open an existing CA directory; the key is loaded (and its passphrase checked) on first signing use."""
        directory = Path(directory)
        if not directory.is_dir():
            raise CAError(f"CA directory {directory} does not exist; "
                          f"create it with `nebula-admin ca init --dir {directory}`")
        for needed in ("ca.pem", "ca.key", "index.db"):
            if not (directory / needed).exists():
                raise CAError(f"CA directory {directory} lacks {needed}; it is not a CA made by `nebula-admin ca init`")
        cert = _load_cert(directory / "ca.pem", "CA certificate")
        return cls(directory, cert, passphrase)

    @property
    def key(self):
        """The CA's private key, loaded on first use (raises CAError for a wrong or missing passphrase)."""
        if self._key is None:
            key = load_private_key(self.key_path, self._passphrase, "CA key")
            if key.public_key().public_numbers() != self.cert.public_key().public_numbers():
                raise CAError(f"CA key {self.key_path} does not belong to {self.cert_path}; restore the matching pair")
            self._key = key
        return self._key

    # ---- internals
    def _db(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.index_path, timeout=30)
        db.row_factory = sqlite3.Row
        return db

    def audit_event(self, action: str, target: str, outcome: str = "ok", detail: dict | None = None) -> None:
        """Append one record to the CA's audit log (every CA operation calls this)."""
        with AuditLog(self.audit_path, self.dir / "audit_signing.key") as audit:
            audit.append(default_actor(), action, target, outcome, detail)

    def _sign_leaf(self, public_key, ident: Identity, days: int | None, dns: Iterable[str],
                   ips: Iterable[str], renewed_from: int | None = None) -> x509.Certificate:
        """Sign a leaf for `ident` and record it: a copy under `certs/` and a row of the index."""
        dns = list(dns) or (["localhost"] if ident.role == "switch" else [])  # (what a local test connects to)
        cert = leaf_certificate(self.cert, self.key, public_key, ident, days, dns, ips)
        pem = cert.public_bytes(serialization.Encoding.PEM)
        atomic_write(self.dir / "certs" / f"{format_serial(cert.serial_number)}.pem", pem, PUBLIC)
        with closing(self._db()) as db, db:
            db.execute(
                "INSERT INTO certs (serial, identity, role, cluster, name, not_before, not_after, renewed_from, pem)"
                " VALUES (?,?,?,?,?,?,?,?,?)",
                (format_serial(cert.serial_number), ident.uri, ident.role, ident.cluster, ident.name,
                 iso(cert.not_valid_before_utc), iso(cert.not_valid_after_utc),
                 None if renewed_from is None else format_serial(renewed_from), pem.decode()),
            )
        return cert

    # ---- public operations
    def issue(self, name: str, role: str, cluster: str | None = None, days: int | None = None,
              dns: Iterable[str] = (), ips: Iterable[str] = (), *, out_dir: str | os.PathLike,
              stem: str | None = None, key_passphrase: str | bytes | None = None) -> IssuedCert:
        """Generate a key pair and certificate for `name` in `role`; writes `<stem>.pem` and `<stem>.key` (0600)."""
        try:
            ident = Identity(self.federation, role, cluster, name)
        except IdentityError as exc:
            raise CAError(str(exc)) from None
        out_dir = Path(out_dir)
        stem = check_name(stem or name, "file stem")
        key = ec.generate_private_key(ec.SECP256R1())
        cert = self._sign_leaf(key.public_key(), ident, days, dns, ips)
        key_path = atomic_write(out_dir / f"{stem}.key", private_key_pem(key, key_passphrase))
        cert_path = atomic_write(out_dir / f"{stem}.pem", cert.public_bytes(serialization.Encoding.PEM))
        self.audit_event("cert.issue", ident.uri, detail={"serial": format_serial(cert.serial_number),
                                                      "not_after": iso(cert.not_valid_after_utc)})
        return IssuedCert(cert_path, key_path, cert.serial_number)

    def sign_csr(self, csr_path: str | os.PathLike, role: str, cluster: str | None = None,
                 days: int | None = None, *, name: str | None = None, dns: Iterable[str] = (),
                 ips: Iterable[str] = (), out: str | os.PathLike | None = None) -> Path:
        """Sign a CSR (the private key never leaves its host); the name is the CSR's CN unless given.

        The certificate is written to `out` (default: the CSR path with suffix `.pem`).
        """
        csr_path = Path(csr_path)
        csr, cn = read_csr(read_file(csr_path, "CSR", CAError, "create one with `nebula-admin cert csr`"), csr_path)
        if name is None and cn is None:
            raise CAError(f"CSR {csr_path} has no common name; pass --name")
        name = cn if name is None else name
        try:
            ident = Identity(self.federation, role, cluster, name)
        except IdentityError as exc:
            raise CAError(f"CSR {csr_path}: {exc}") from None
        cert = self._sign_leaf(csr.public_key(), ident, days, dns, ips)
        out = Path(out) if out is not None else csr_path.with_suffix(".pem")
        atomic_write(out, cert.public_bytes(serialization.Encoding.PEM), PUBLIC)
        self.audit_event("cert.sign_csr", ident.uri, detail={"serial": format_serial(cert.serial_number),
                                                         "csr": str(csr_path)})
        return out

    def renew(self, serial: int | str, days: int | None = None, *, out: str | os.PathLike | None = None,
              revoke_old: bool = False) -> IssuedCert:
        """Issue a new certificate (new serial, fresh validity) for the same identity and public key.

        The old certificate stays valid until it expires unless `revoke_old` (reason superseded).
        Written to `out` or to `certs/<new serial>.pem`.
        """
        serial = parse_serial(serial)
        row = self._row(serial)
        if row["status"] == "revoked":
            raise CAError(f"serial {format_serial(serial)} is revoked; issue a new certificate instead of renewing")
        old = x509.load_pem_x509_certificate(row["pem"].encode())
        ident = identity_of(old)
        san = old.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        dns = san.get_values_for_type(x509.DNSName)
        ips = [str(i) for i in san.get_values_for_type(x509.IPAddress)]
        cert = self._sign_leaf(old.public_key(), ident, days, dns, ips, renewed_from=serial)
        path = self.dir / "certs" / f"{format_serial(cert.serial_number)}.pem"
        if out is not None:
            path = atomic_write(out, cert.public_bytes(serialization.Encoding.PEM), PUBLIC)
        self.audit_event("cert.renew", ident.uri, detail={"old_serial": format_serial(serial),
                                                      "serial": format_serial(cert.serial_number)})
        if revoke_old:
            self.revoke(serial, "superseded")
        return IssuedCert(path, None, cert.serial_number)

    def _row(self, serial: int) -> sqlite3.Row:
        with closing(self._db()) as db:
            row = db.execute("SELECT * FROM certs WHERE serial = ?", (format_serial(serial),)).fetchone()
        if row is None:
            raise CAError(f"serial {format_serial(serial)} was not issued by this CA ({self.dir}); "
                          "see `nebula-admin cert list`")
        return row

    def revoke(self, serial: int | str, reason: str = "unspecified") -> None:
        """Mark `serial` revoked with `reason` and rewrite `crl.pem`."""
        serial = parse_serial(serial)
        if reason not in REVOCATION_REASONS:
            raise CAError(f"revocation reason {reason!r} is unknown; use one of {', '.join(REVOCATION_REASONS)}")
        row = self._row(serial)
        if row["status"] == "revoked":
            raise CAError(f"serial {format_serial(serial)} is already revoked ({row['reason']}, {row['revoked_at']})")
        self.key  # fail on a wrong passphrase before changing the index
        with closing(self._db()) as db, db:
            db.execute("UPDATE certs SET status='revoked', revoked_at=?, reason=? WHERE serial=?",
                       (iso(now()), reason, format_serial(serial)))
        self._write_crl_to(self.crl_path)
        self.audit_event("cert.revoke", row["identity"], detail={"serial": format_serial(serial), "reason": reason})

    def write_crl(self, path: str | os.PathLike | None = None, days: int = CRL_DAYS) -> Path:
        """Write a fresh CRL (next update in `days`) to `path` (default: the CA's `crl.pem`)."""
        if not isinstance(days, (int, float)) or days <= 0:
            raise CAError(f"CRL next update in days={days!r} must be a positive number of days")
        path = Path(path) if path is not None else self.crl_path
        self._write_crl_to(path, days)
        if path != self.crl_path:  # keep the CA's own copy as fresh as the exported one
            self._write_crl_to(self.crl_path, days)
        self.audit_event("crl.write", str(path), detail={"next_update_days": days})
        return path

    def _write_crl_to(self, path: Path, days: int = CRL_DAYS) -> None:
        with closing(self._db()) as db:
            rows = db.execute("SELECT serial, revoked_at, reason FROM certs WHERE status='revoked'").fetchall()
            number = db.execute("SELECT value FROM meta WHERE key='crl_number'").fetchone()
        number = int(number[0]) + 1 if number else 1
        revoked = [(int(r["serial"], 16), dt.datetime.strptime(r["revoked_at"], "%Y-%m-%dT%H:%M:%SZ")
                    .replace(tzinfo=dt.timezone.utc), r["reason"]) for r in rows]
        crl = revocation_list(self.cert, self.key, revoked, number, days)
        atomic_write(path, crl.public_bytes(serialization.Encoding.PEM), PUBLIC)
        with closing(self._db()) as db, db:
            db.execute("INSERT OR REPLACE INTO meta VALUES ('crl_number', ?)", (str(number),))

    def list(self) -> list[CertRecord]:
        """Every certificate this CA issued, oldest first; status is valid, revoked or expired."""
        today = iso(now())
        with closing(self._db()) as db:
            rows = db.execute("SELECT * FROM certs ORDER BY not_before, rowid").fetchall()
        out = []
        for r in rows:
            status = r["status"]
            if status == "valid" and r["not_after"] < today:
                status = "expired"
            out.append(CertRecord(int(r["serial"], 16), r["identity"], r["role"], r["cluster"], r["name"],
                                  r["not_before"], r["not_after"], status, r["reason"], r["revoked_at"]))
        return out

    def certificate(self, serial: int | str) -> x509.Certificate:
        """The issued certificate with `serial`."""
        return x509.load_pem_x509_certificate(self._row(parse_serial(serial))["pem"].encode())


def csr_from_key(key_path: str | os.PathLike, name: str, out: str | os.PathLike, *, uri: str | None = None,
                 key_passphrase: str | bytes | None = None) -> Path:
    """A CSR for `name` (and identity `uri`) from the existing key at `key_path`, written to `out`: a renewal
    for the key a host already uses (`provision renew --csr`), which never leaves it."""
    key = load_private_key(key_path, key_passphrase, "private key")
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise CAError(f"private key {key_path} is {type(key).__name__}, not ECDSA; a Nebula kit's keys are P-256")
    check_name(name, "name")
    return atomic_write(out, csr_for(name, key, uri).public_bytes(serialization.Encoding.PEM), PUBLIC)


def make_csr(name: str, out_dir: str | os.PathLike, *, stem: str | None = None,
             key_passphrase: str | bytes | None = None) -> tuple[Path, Path]:
    """Create a key pair and CSR on the requesting host; returns (csr_path, key_path). The key stays here."""
    check_name(name, "name")
    out_dir = Path(out_dir)
    stem = check_name(stem or name, "file stem")
    key = ec.generate_private_key(ec.SECP256R1())
    csr = csr_for(name, key)
    key_path = atomic_write(out_dir / f"{stem}.key", private_key_pem(key, key_passphrase))
    csr_path = atomic_write(out_dir / f"{stem}.csr", csr.public_bytes(serialization.Encoding.PEM), PUBLIC)
    return csr_path, key_path

