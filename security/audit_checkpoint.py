"""Signed checkpoints of an audit log: the Ed25519 signing key, the checkpoint statement, and how a record of the
chain carries one (`security.audit` writes them, `security.audit_verify` checks them)."""
from __future__ import annotations

import base64
import functools
import json
import os
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from security._files import atomic_write, read_file
from security.errors import AuditError

__all__ = ["CHECKPOINT_ACTION", "GENESIS", "PEER_CHECKPOINT_ACTION", "Checkpoint", "canonical",
           "checkpoint_of_record", "generate_signing_key", "load_signing_key", "public_key_pem", "signer_field", "signer_of",
           "verify_checkpoint"]

GENESIS = "0" * 64
CHECKPOINT_ACTION = "audit.checkpoint"
PEER_CHECKPOINT_ACTION = "audit.peer_checkpoint"


def canonical(obj: Any) -> str:
    """The one JSON form that is hashed and signed: sorted keys, no spaces."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def generate_signing_key(path: str | os.PathLike) -> bytes:
    """Create an Ed25519 checkpoint signing key at `path` (0600); return its public key PEM."""
    key = ed25519.Ed25519PrivateKey.generate()
    atomic_write(path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                         serialization.NoEncryption()))
    return key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def load_signing_key(path: str | os.PathLike) -> ed25519.Ed25519PrivateKey:
    """The Ed25519 key at `path` that signs a log's checkpoints; AuditError naming the fix if it is unusable."""
    data = read_file(path, "audit signing key", AuditError,
                     "create it with `nebula-admin audit keygen --out PATH` (or nebula-admin provision)")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise AuditError(f"audit signing key {path} is not an unencrypted PEM Ed25519 key ({exc})") from None
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise AuditError(f"audit signing key {path} is a {type(key).__name__}, expected Ed25519")
    return key


def _raw_public(pem: bytes) -> bytes:
    """Raw 32-byte Ed25519 public key from a public (or private) key PEM."""
    try:
        if b"PRIVATE KEY" in pem:
            key = serialization.load_pem_private_key(pem, password=None).public_key()
        else:
            key = serialization.load_pem_public_key(pem)
    except (ValueError, TypeError) as exc:
        raise AuditError(f"audit public key is not a valid PEM key ({exc})") from None
    if not isinstance(key, ed25519.Ed25519PublicKey):
        raise AuditError(f"audit public key is a {type(key).__name__}, expected Ed25519")
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def signer_of(pem: bytes) -> str:
    """The `signer` field (base64 raw Ed25519 public key) that checkpoints signed by `pem`'s key carry."""
    return base64.b64encode(_raw_public(pem)).decode()


def signer_field(public_key: ed25519.Ed25519PublicKey) -> str:
    """The `signer` field of checkpoints signed by the private half of `public_key`."""
    return base64.b64encode(public_key.public_bytes(serialization.Encoding.Raw,
                                                    serialization.PublicFormat.Raw)).decode()


def public_key_pem(signing_key_path: str | os.PathLike) -> bytes:
    """Public key PEM of the Ed25519 signing key at `signing_key_path` (to pin it in `verify_log`)."""
    return load_signing_key(signing_key_path).public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A signed statement that the log's record `seq` has hash `head`."""

    seq: int
    head: str
    time: float
    signer: str  # raw Ed25519 public key, base64
    signature: str  # base64

    def message(self) -> bytes:
        """The bytes that are signed."""
        return canonical({"kind": "nebula-audit-checkpoint", "seq": self.seq, "head": self.head,
                           "time": self.time, "signer": self.signer}).encode()

    def to_json(self) -> str:
        """One-line JSON form (as stored and as sent to peers)."""
        return canonical({"seq": self.seq, "head": self.head, "time": self.time, "signer": self.signer,
                           "signature": self.signature})

    @classmethod
    def from_json(cls, s: str | bytes) -> "Checkpoint":
        """Parse `to_json` output; raise AuditError for anything malformed."""
        try:
            d = json.loads(s)
            cp = cls(seq=d["seq"], head=d["head"], time=d["time"], signer=d["signer"], signature=d["signature"])
        except (ValueError, KeyError, TypeError) as exc:
            raise AuditError(f"checkpoint is malformed ({exc!r}); expected the JSON written by AuditLog") from None
        if set(d) != {"seq", "head", "time", "signer", "signature"} or not isinstance(cp.seq, int) \
                or not isinstance(cp.head, str) or len(cp.head) != 64:
            raise AuditError(f"checkpoint {str(s)[:80]!r} has unexpected fields or values")
        return cp


def verify_checkpoint(cp: Checkpoint, public_key_pem: bytes | None = None) -> None:
    """Raise AuditError unless `cp` is signed correctly (by `public_key_pem`'s key when given)."""
    try:
        signer = base64.b64decode(cp.signer, validate=True)
        sig = base64.b64decode(cp.signature, validate=True)
        holds = _signature_holds(signer, sig, cp.message())
    except ValueError as exc:
        raise AuditError(f"checkpoint at seq {cp.seq} has a malformed signer or signature ({exc})") from None
    if public_key_pem is not None and _raw_public(public_key_pem) != signer:
        raise AuditError(f"checkpoint at seq {cp.seq} was signed by a different key than the one pinned")
    if not holds:
        raise AuditError(f"checkpoint at seq {cp.seq} has an invalid signature (checkpoint edited)")


@functools.lru_cache(maxsize=256)
def _signature_holds(signer: bytes, sig: bytes, message: bytes) -> bool:
    """Whether `sig` is `signer`'s Ed25519 signature of `message` (ValueError for a malformed key). Remembered by
    value: a combiner's checkpoint comes back with each of a round's messages and is checked at each step that takes
    it (the witness, the audit log), and the same bytes verify the same way every time."""
    try:
        ed25519.Ed25519PublicKey.from_public_bytes(signer).verify(sig, message)
    except InvalidSignature:
        return False
    return True


def checkpoint_of_record(rec: dict) -> Checkpoint | None:
    """The checkpoint an `audit.checkpoint` (or `audit.peer_checkpoint`) record carries; None for other records."""
    if rec.get("action") == CHECKPOINT_ACTION:
        d = rec.get("detail")
        if not isinstance(d, dict):
            raise AuditError(f"checkpoint record {rec.get('seq')} has no detail")
        return Checkpoint.from_json(canonical({k: d.get(k) for k in ("seq", "head", "time", "signer", "signature")}))
    if rec.get("action") == PEER_CHECKPOINT_ACTION:
        d = rec.get("detail")
        if not isinstance(d, dict) or not isinstance(d.get("checkpoint"), dict):
            raise AuditError(f"peer checkpoint record {rec.get('seq')} has no checkpoint")
        return Checkpoint.from_json(canonical(d["checkpoint"]))
    return None
