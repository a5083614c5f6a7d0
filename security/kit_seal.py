"""A kit's signed manifest (`kit.sig`) and the check a switch makes of its kit when it starts and on each reload.

`nebula-admin provision` seals each kit with the CA key: the sha256 of every file it ships, the kit's revision, its
peers and the number of the CRL it holds. Three files are the site's own to change and are checked otherwise:
`switch.yaml` (its operator tunes it; only peers the admin signed may be in it), `crl.pem` (fresh CRLs replace it:
it must be signed by the CA and not older than the newest one the admin's statements name) and `kit.yaml`. A peers
update applied with `nebula-switch reload --update` is kept in the kit (`applied-update.json`: its update.yaml and
update.sig, written at once): from then on its signed revision, peers and CRL number are the ones in force, and
the switch certificate (`switch.pem`) may be the one that update signs instead of the sealed one (a renewal: the
admin's `provision renew` sends each site its current certificate in every update). A
directory without `kit.sig` and `kit.yaml` is not a kit (a switch.yaml written by hand) and is not checked.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from cryptography import x509

from security._files import PUBLIC, atomic_write
from security.audit_checkpoint import canonical
from security.errors import SecurityError, TLSConfigError
from security.signing import SignatureError, Statement, crl_number, sha256_hex, sign_statement, verify_statement
from security.tls import load_crl

__all__ = ["APPLIED_UPDATE", "CERT_FILE", "KIT_FILE", "KitError", "KitState", "SEAL_FILE", "WORKERS_DIR",
           "applied_record", "ca_certificate", "check_kit", "crl_number_at", "is_renewable", "kit_is_sealed",
           "seal_kit", "sealed_files", "worker_cert_name"]

KIT_FILE = "kit.yaml"
SEAL_FILE = "kit.sig"
APPLIED_UPDATE = "applied-update.json"  # the last peers update applied here, as the admin signed it
CERT_FILE = "switch.pem"  # the switch's certificate: renewed by peers updates (`security.updates`)
WORKERS_DIR = "workers"  # the workers' credentials; their certificates (`workers/<name>.pem`) are renewed likewise
_WORKER_CERT = re.compile(r"workers/([A-Za-z0-9][A-Za-z0-9_.-]{0,63})\.pem")
# the site changes these itself (its configuration, fresh CRLs, the record of updates): checked, not hashed
SITE_FILES = frozenset({"switch.yaml", "crl.pem", KIT_FILE, SEAL_FILE, APPLIED_UPDATE})
# what a running switch writes into its directory (never part of a kit)
RUNTIME = frozenset({"audit.log", "state", "switch.log", "switch.stderr", "switch.stdout", "switch.pid"})
MAX_FILE_BYTES = 16 << 20  # a kit's files are certificates, keys and YAML: a few KiB each


def worker_cert_name(path: str) -> str | None:
    """The worker credential whose certificate kit path `path` is (`workers/<name>.pem`), else None."""
    m = _WORKER_CERT.fullmatch(path)
    return m.group(1) if m and ".." not in path else None


def is_renewable(path: str) -> bool:
    """Whether kit file `path` is a certificate that peers updates renew (the switch's and its workers')."""
    return path == CERT_FILE or worker_cert_name(path) is not None


class KitError(SecurityError):
    """A kit's files are not what its admin signed; the message names the file and the fix."""


@dataclass(frozen=True, slots=True)
class KitState:
    """What the admin's statements put in force in a kit: its revision, peers and least CRL number, who signed."""

    revision: int
    crl_number: int
    peers: tuple[str, ...]
    signer: str
    source: str  # kit.sig, or applied-update.json (revision N)


def sealed_files(d: Path) -> list[str]:
    """The files of kit `d` its manifest covers (relative paths, sorted): every regular file the admin ships."""
    out = []
    for top in sorted(os.listdir(d)):
        if top.startswith(".") or top in RUNTIME or top in SITE_FILES or top.startswith("audit.log"):
            continue
        path = d / top
        if path.is_dir():
            if top == "workers":
                out += [f"workers/{n}" for n in sorted(os.listdir(path))
                        if not n.startswith(".") and (path / n).is_file()]
        elif path.is_file():
            out.append(top)
    return out


def _hash_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 16):
            h.update(chunk)
    return h.hexdigest()


def crl_number_at(path: str | os.PathLike, ca: x509.Certificate) -> int:
    """The CRL Number of the CRL file at `path` if `ca` signed it (expired or not); 0 otherwise."""
    try:
        crl = x509.load_pem_x509_crl(Path(path).read_bytes())
    except (OSError, ValueError):
        return 0
    return crl_number(crl) if crl.is_signature_valid(ca.public_key()) else 0


def seal_kit(ca: Any, d: Path, federation: str, cluster: str, revision: int, peers: Iterable[str]) -> Statement:
    """Write `kit.sig` into kit `d`: the CA (`ca`: its `cert`, `key`) signs its files' hashes, `revision`, `peers`
    and the number of its CRL."""
    statement = Statement("kit", federation, cluster, revision, crl_number_at(d / "crl.pem", ca.cert), tuple(peers),
                          tuple((name, _hash_file(d / name)) for name in sealed_files(d)))
    atomic_write(d / SEAL_FILE, sign_statement(statement, ca.cert, ca.key), PUBLIC)
    return statement


def kit_is_sealed(d: Path) -> bool:
    """Whether `d` is a provisioned kit (a manifest or a kit file lies there)."""
    return (d / SEAL_FILE).exists() or (d / KIT_FILE).exists()


def ca_certificate(path: str | os.PathLike) -> x509.Certificate:
    """The CA certificate at `path`; KitError naming it otherwise."""
    try:
        return x509.load_pem_x509_certificate(Path(path).read_bytes())
    except (OSError, ValueError) as exc:
        raise KitError(f"CA certificate {path} cannot be read ({exc}); get the kit again from the admin") from None


def _read_small(path: Path, what: str) -> bytes:
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise KitError(f"{what} {path} is larger than a kit's file can be; get the kit again from the admin")
        return path.read_bytes()
    except FileNotFoundError:
        raise KitError(f"{what} {path} is missing; get the kit again from the admin") from None
    except OSError as exc:
        raise KitError(f"{what} {path} cannot be read ({exc.strerror}); check its permissions") from None


def applied_record(update_yaml: bytes, update_sig: bytes) -> bytes:
    """The content of `applied-update.json`: an update's two signed files in one (written atomically)."""
    return (canonical({"update.yaml": update_yaml.decode("utf-8"), "update.sig": update_sig.decode("utf-8")})
            + "\n").encode()


def _applied(d: Path, ca: x509.Certificate, seal: Statement) -> tuple[Statement, str] | None:
    """The last peers update applied to kit `d` (checked), None if none was."""
    path = d / APPLIED_UPDATE
    if not path.exists():
        return None
    try:
        record = json.loads(_read_small(path, "applied update"))
        doc, sig = record["update.yaml"].encode(), record["update.sig"].encode()
    except (ValueError, RecursionError, KeyError, TypeError, AttributeError):
        raise KitError(f"{path} is malformed; apply the admin's latest update again (`nebula-switch reload "
                       "--update`) or get the kit again") from None
    try:
        statement, signer = verify_statement(sig, ca, "peers_update", str(path))
    except SignatureError as exc:
        raise KitError(str(exc)) from None
    if statement.file_hash("update.yaml") != sha256_hex(doc):
        raise KitError(f"{path} was altered since the admin signed it; apply the admin's latest update again "
                       "(`nebula-switch reload --update`) or get the kit again")
    if (statement.federation, statement.cluster) != (seal.federation, seal.cluster):
        raise KitError(f"{path} is for cluster {statement.cluster} of {statement.federation}, this kit is "
                       f"{seal.cluster} of {seal.federation}; get the kit again from the admin")
    return statement, signer


def check_kit(config: str | os.PathLike, *, federation: str, cluster: str, ca_path: str | os.PathLike,
              crl_path: str | os.PathLike, peers: Iterable[str], check_crl: bool = True) -> KitState | None:
    """Check the kit that switch.yaml `config` lies in against its admin's signatures (the CA at `ca_path`): every
    shipped file unaltered, `federation` and `cluster` as signed, `peers` among the signed ones, and (`check_crl`)
    the CRL at `crl_path` CA-signed, unexpired and not older than the signed CRL number. The state in force; None
    for a config that is not in a kit; KitError of one line naming the file and the fix otherwise."""
    d = Path(config).resolve().parent
    if not kit_is_sealed(d):
        return None
    ca = ca_certificate(ca_path)
    seal_path = d / SEAL_FILE
    try:
        seal, signer = verify_statement(_read_small(seal_path, "kit manifest"), ca, "kit", str(seal_path))
    except SignatureError as exc:
        raise KitError(str(exc)) from None
    if (seal.federation, seal.cluster) != (federation, cluster):
        raise KitError(f"{seal_path} seals cluster {seal.cluster} of {seal.federation}, but {config} says "
                       f"{cluster} of {federation}; use the kit's own switch.yaml")
    applied = _applied(d, ca, seal)
    # (a certificate the latest applied update signs replaces the sealed one: every update carries them all)
    renewal = applied[0] if applied is not None and applied[0].revision > seal.revision else None
    for name, digest in seal.files:
        path = d / name
        renewed = renewal.file_hash(name) if renewal is not None and is_renewable(name) else None
        if _hash_file_checked(path) not in (digest, renewed or digest):
            raise KitError(f"kit file {path} was altered since the admin signed the kit ({SEAL_FILE}); get the kit "
                           "again from the admin (or restore that file from its archive)")
    state = KitState(seal.revision, seal.crl_number, seal.peers, signer, SEAL_FILE)
    if applied is not None and applied[0].revision > seal.revision:
        update, by = applied
        state = KitState(update.revision, max(update.crl_number, seal.crl_number), update.peers, by,
                         f"{APPLIED_UPDATE} (revision {update.revision})")
    stray = [p for p in peers if p not in state.peers]
    if stray:
        raise KitError(f"{config} lists peer {stray[0]}, which the admin's signed peers ({state.source}: "
                       f"{', '.join(state.peers) or 'none'}) do not include; remove it, or apply the admin's signed "
                       "peers update (`nebula-switch reload --update`)")
    if not check_crl:
        return state
    try:
        number = crl_number(load_crl(crl_path, ca))
    except TLSConfigError as exc:
        raise KitError(str(exc)) from None
    if number < state.crl_number:
        raise KitError(f"CRL {crl_path} is number {number}, older than number {state.crl_number} that the admin "
                       f"signed ({state.source}); put the admin's current CRL there (`nebula-admin crl`)")
    return state


def _hash_file_checked(path: Path) -> str:
    """sha256 of kit file `path`; KitError if it is missing or unreadable."""
    try:
        return _hash_file(path)
    except FileNotFoundError:
        raise KitError(f"kit file {path} is missing (the admin's {SEAL_FILE} lists it); get the kit again from the "
                       "admin (or restore that file from its archive)") from None
    except OSError as exc:
        raise KitError(f"kit file {path} cannot be read ({exc.strerror}); check its permissions") from None
