"""Statements the federation's admin signs with the CA key: a kit's manifest and each peers update.

The CA's certificate is in every kit already, so a switch checks what its admin sends without a key pinned
anywhere else. A statement names what it binds (kind, federation, cluster, revision, CRL number, the peers) and the
sha256 of every file it vouches for; its signature is ECDSA P-256 (SHA-256) over the statement's canonical JSON.

    {"statement": {"kind": "peers_update", "federation": "acme", "cluster": "A", "revision": 3, "crl_number": 7,
                   "peers": ["B", "D"], "files": {"update.yaml": "<sha256>", "crl.pem": "<sha256>"}},
     "signer": "sha256:<sha256 of the CA's public key>", "signature": "<base64 DER>"}
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from security.audit_checkpoint import canonical
from security.errors import SecurityError

__all__ = ["KINDS", "MAX_STATEMENT_BYTES", "SignatureError", "Statement", "crl_number", "key_fingerprint",
           "sha256_hex", "sign_statement", "verify_statement"]

KINDS = ("kit", "peers_update")
MAX_STATEMENT_BYTES = 256 * 1024  # a kit lists a few dozen files; anything larger is not one of ours
_HEX64 = re.compile(r"[0-9a-f]{64}")
_FILE = re.compile(r"[A-Za-z0-9_.-]{1,128}(/[A-Za-z0-9_.-]{1,128}){0,3}")


class SignatureError(SecurityError):
    """A signed statement is missing, malformed, signed by another key, or does not verify."""


@dataclass(frozen=True, slots=True)
class Statement:
    """What the admin vouches for: `files` maps each file's path (relative) to its sha256 (hex)."""

    kind: str
    federation: str
    cluster: str
    revision: int
    crl_number: int
    peers: tuple[str, ...]
    files: tuple[tuple[str, str], ...]

    def file_hash(self, name: str) -> str | None:
        """The sha256 the statement gives for `name`, None if it names no such file."""
        return dict(self.files).get(name)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "federation": self.federation, "cluster": self.cluster, "revision": self.revision,
                "crl_number": self.crl_number, "peers": list(self.peers), "files": dict(self.files)}


def sha256_hex(data: bytes) -> str:
    """Hex sha256 of `data` (what statements list for a file)."""
    return hashlib.sha256(data).hexdigest()


def key_fingerprint(public_key: Any) -> str:
    """`sha256:<hex>` of a public key's SubjectPublicKeyInfo: how records and messages name a signer."""
    der = public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return "sha256:" + sha256_hex(der)


def crl_number(crl: x509.CertificateRevocationList) -> int:
    """The CRL Number extension of `crl` (X.509; it rises with every CRL the CA writes); 0 when it has none."""
    try:
        return int(crl.extensions.get_extension_for_class(x509.CRLNumber).value.crl_number)
    except x509.ExtensionNotFound:
        return 0


def sign_statement(statement: Statement, ca_cert: x509.Certificate, ca_key: Any) -> bytes:
    """The signed form of `statement` (one JSON line), signed by the CA key `ca_key` of `ca_cert`."""
    body = canonical(statement.to_dict()).encode()
    signature = ca_key.sign(body, ec.ECDSA(hashes.SHA256()))
    return (canonical({"statement": statement.to_dict(), "signer": key_fingerprint(ca_cert.public_key()),
                       "signature": base64.b64encode(signature).decode()}) + "\n").encode()


def _statement(doc: Any, where: str) -> Statement:
    """The Statement in a parsed signed document, every field checked; SignatureError naming `where`."""
    def bad(what: str) -> SignatureError:
        return SignatureError(f"{where} is malformed ({what}); ask the admin for it again")

    if not isinstance(doc, dict) or set(doc) != {"statement", "signer", "signature"}:
        raise bad("expected statement, signer, signature")
    st = doc["statement"]
    keys = {"kind": str, "federation": str, "cluster": str, "revision": int, "crl_number": int, "peers": list,
            "files": dict}
    if not isinstance(st, dict) or set(st) != set(keys):
        raise bad(f"its statement must hold exactly {', '.join(keys)}")
    for key, kind in keys.items():
        if not isinstance(st[key], kind) or isinstance(st[key], bool):
            raise bad(f"statement.{key} is not a {kind.__name__}")
    if st["kind"] not in KINDS or not 0 <= st["revision"] < 2**63 or not 0 <= st["crl_number"] < 2**160:
        raise bad("statement.kind, revision or crl_number out of range")
    if not all(isinstance(p, str) and 0 < len(p) <= 128 for p in st["peers"]) or len(st["peers"]) > 4096:
        raise bad("statement.peers must be cluster names")
    files = st["files"]
    if len(files) > 4096 or not all(isinstance(k, str) and _FILE.fullmatch(k) and ".." not in k.split("/")
                                    and isinstance(v, str) and _HEX64.fullmatch(v) for k, v in files.items()):
        raise bad("statement.files must map relative paths to sha256 hex digests")
    return Statement(st["kind"], st["federation"], st["cluster"], st["revision"], st["crl_number"],
                     tuple(st["peers"]), tuple(sorted(files.items())))


def verify_statement(data: bytes, ca_cert: x509.Certificate, kind: str, where: str) -> tuple[Statement, str]:
    """(the statement signed in `data`, its signer's fingerprint) if the CA key of `ca_cert` signed it and it is of
    `kind`; SignatureError of one line naming `where` (the file), the problem and the fix otherwise."""
    if len(data) > MAX_STATEMENT_BYTES:
        raise SignatureError(f"{where} is larger than {MAX_STATEMENT_BYTES} bytes; not a signature the admin wrote")
    try:
        doc = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # (RecursionError: brackets nested thousands deep)
        raise SignatureError(f"{where} is not a signed statement ({type(exc).__name__}); ask the admin for it "
                             "again") from None
    statement = _statement(doc, where)
    ca_key = ca_cert.public_key()
    trusted = key_fingerprint(ca_key)
    signer = doc["signer"]
    if not isinstance(signer, str) or signer != trusted:
        raise SignatureError(f"{where} is signed by another key ({str(signer)[:80]}), not by this kit's CA "
                             f"({trusted}); use only what the federation's admin sent")
    if statement.kind != kind:
        raise SignatureError(f"{where} signs a {statement.kind}, not a {kind}; use the file the admin sent for this")
    if not isinstance(ec_key := ca_key, ec.EllipticCurvePublicKey):
        raise SignatureError(f"the CA's key is {type(ca_key).__name__}, not ECDSA; a Nebula CA signs with P-256")
    try:
        signature = base64.b64decode(doc["signature"], validate=True) if isinstance(doc["signature"], str) else b""
        ec_key.verify(signature, canonical(statement.to_dict()).encode(), ec.ECDSA(hashes.SHA256()))
    except (InvalidSignature, binascii.Error, ValueError):
        raise SignatureError(f"{where}: its signature does not verify (altered after the admin signed it); use "
                             "only what the federation's admin sent") from None
    return statement, signer
