"""Tamper-evident audit log: hash-chained JSON-lines records with Ed25519-signed checkpoints.

Files: `<log>` holds one record per line, each carrying `prev` (hash of the record before) and `hash`
(sha256 of its own canonical JSON without `hash`). `<log>.checkpoints` holds signed checkpoints
(seq, head hash, time, signer) written every `checkpoint_every` records and on close; a checkpoint kept
outside the log is what exposes a log truncated back past it. `<log>.peers/<cluster>.checkpoints` keeps
checkpoints received from other clusters' switches (witnesses for their logs). Several processes may
append to one log: each append takes an exclusive `flock` on the log and first catches up with records
the others wrote.
"""
from __future__ import annotations

import base64
import fcntl
import getpass
import hashlib
import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from security._files import atomic_write, read_file
from security.errors import AuditError

__all__ = [
    "AuditLog",
    "default_actor",
    "Checkpoint",
    "VerifyReport",
    "GENESIS",
    "generate_signing_key",
    "public_key_pem",
    "verify_checkpoint",
    "verify_log",
    "read_records",
    "read_checkpoints",
    "filter_records",
    "checkpoints_path",
    "peer_checkpoints_path",
]

GENESIS = "0" * 64
_RECORD_KEYS = frozenset({"seq", "time", "actor", "action", "target", "outcome", "detail", "prev", "hash"})


def default_actor() -> str:
    """Who is acting, for audit records: $NEBULA_ACTOR, else the OS user."""
    if os.environ.get("NEBULA_ACTOR"):
        return os.environ["NEBULA_ACTOR"]
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry for this uid (e.g. some containers)
        return f"uid:{os.getuid()}"


def checkpoints_path(log: str | os.PathLike) -> Path:
    """Where the checkpoints of `log` are kept."""
    log = Path(log)
    return log.with_name(log.name + ".checkpoints")


def peer_checkpoints_path(log: str | os.PathLike, cluster: str) -> Path:
    """Where checkpoints received from `cluster` are kept, beside `log`."""
    log = Path(log)
    return log.with_name(log.name + ".peers") / f"{cluster}.checkpoints"


def _canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def generate_signing_key(path: str | os.PathLike) -> bytes:
    """Create an Ed25519 checkpoint signing key at `path` (0600); return its public key PEM."""
    key = ed25519.Ed25519PrivateKey.generate()
    atomic_write(path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                         serialization.NoEncryption()))
    return key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def _load_signing_key(path: str | os.PathLike) -> ed25519.Ed25519PrivateKey:
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


def public_key_pem(signing_key_path: str | os.PathLike) -> bytes:
    """Public key PEM of the Ed25519 signing key at `signing_key_path` (to pin it in `verify_log`)."""
    return _load_signing_key(signing_key_path).public_key().public_bytes(
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
        return _canonical({"kind": "nebula-audit-checkpoint", "seq": self.seq, "head": self.head,
                           "time": self.time, "signer": self.signer}).encode()

    def to_json(self) -> str:
        """One-line JSON form (as stored and as sent to peers)."""
        return _canonical({"seq": self.seq, "head": self.head, "time": self.time, "signer": self.signer,
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
        key = ed25519.Ed25519PublicKey.from_public_bytes(signer)
    except ValueError as exc:
        raise AuditError(f"checkpoint at seq {cp.seq} has a malformed signer or signature ({exc})") from None
    if public_key_pem is not None and _raw_public(public_key_pem) != signer:
        raise AuditError(f"checkpoint at seq {cp.seq} was signed by a different key than the one pinned")
    try:
        key.verify(sig, cp.message())
    except InvalidSignature:
        raise AuditError(f"checkpoint at seq {cp.seq} has an invalid signature (checkpoint edited)") from None


class AuditLog:
    """Appender for one audit log; a context manager whose close writes a final checkpoint."""

    def __init__(self, path: str | os.PathLike, signing_key_path: str | os.PathLike,
                 checkpoint_every: int = 1000) -> None:
        if checkpoint_every < 1:
            raise ValueError(f"checkpoint_every={checkpoint_every} must be >= 1")
        self.path = Path(path)
        self.checkpoint_every = checkpoint_every
        self._key = _load_signing_key(signing_key_path)
        self._signer = base64.b64encode(self._key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw)).decode()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            self._rfd = os.open(self.path, os.O_RDONLY)
        except OSError as exc:
            raise AuditError(f"audit log {self.path} cannot be opened ({exc.strerror}); check the path") from None
        self._lock = threading.Lock()
        self._seq = 0
        self._head = GENESIS
        self._offset = -1  # bytes of the log already accounted for; -1 = not yet read
        self._last_cp_seq = -1
        self._closed = False

    # ---- catching up with other writers (called with the flock held)
    def _sync(self) -> None:
        size = os.fstat(self._fd).st_size
        if size == self._offset:
            return
        if size == 0:
            self._seq, self._head = 0, GENESIS
        else:
            last = self._last_line(size)
            try:
                rec = json.loads(last)
                self._seq, self._head = int(rec["seq"]), str(rec["hash"])
            except (ValueError, KeyError, TypeError):
                raise AuditError(f"audit log {self.path} ends with a malformed record; run "
                                 f"`nebula-admin audit verify --log {self.path}`") from None
        self._offset = size

    def _last_line(self, size: int) -> bytes:
        end = size
        buf = b""
        while True:
            start = max(0, end - 8192)
            chunk = os.pread(self._rfd, end - start, start)
            buf = chunk + buf
            if not buf.endswith(b"\n"):
                raise AuditError(f"audit log {self.path} ends with a partial record; run "
                                 f"`nebula-admin audit verify --log {self.path}`")
            nl = buf.rfind(b"\n", 0, len(buf) - 1)
            if nl >= 0 or start == 0:
                return buf[nl + 1:]
            end = start

    def append(self, actor: str, action: str, target: str, outcome: str = "ok",
               detail: dict | None = None) -> int:
        """Append one record and return its sequence number (a checkpoint follows every N-th record)."""
        for name, value in (("actor", actor), ("action", action), ("target", target), ("outcome", outcome)):
            if not isinstance(value, str):
                raise AuditError(f"audit {name} must be a string, got {type(value).__name__}")
        if detail is not None and not isinstance(detail, dict):
            raise AuditError(f"audit detail must be a dict or None, got {type(detail).__name__}")
        with self._lock:
            if self._closed:
                raise AuditError(f"audit log {self.path} is closed")
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                self._sync()
                seq = self._seq + 1
                body = _canonical({"seq": seq, "time": round(time.time(), 6), "actor": actor, "action": action,
                                   "target": target, "outcome": outcome, "detail": detail or {},
                                   "prev": self._head})
                digest = hashlib.sha256(body.encode()).hexdigest()
                line = f'{body[:-1]},"hash":"{digest}"}}\n'.encode()
                os.write(self._fd, line)
                self._offset += len(line)
                self._seq, self._head = seq, digest
                if seq % self.checkpoint_every == 0:
                    self._checkpoint_locked()
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
        return seq

    def _checkpoint_locked(self) -> Checkpoint:
        os.fsync(self._fd)
        cp = Checkpoint(seq=self._seq, head=self._head, time=round(time.time(), 6), signer=self._signer, signature="")
        sig = base64.b64encode(self._key.sign(cp.message())).decode()
        cp = Checkpoint(seq=cp.seq, head=cp.head, time=cp.time, signer=cp.signer, signature=sig)
        fd = os.open(checkpoints_path(self.path), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, (cp.to_json() + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        self._last_cp_seq = cp.seq
        return cp

    def checkpoint(self) -> Checkpoint:
        """Sign and store a checkpoint of the current head now."""
        with self._lock:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                self._sync()
                return self._checkpoint_locked()
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    @property
    def seq(self) -> int:
        """Sequence number of the last record this writer knows of."""
        return self._seq

    def store_peer_checkpoint(self, cluster: str, cp: Checkpoint) -> None:
        """Keep a checkpoint received from `cluster` beside this log (signature checked first)."""
        verify_checkpoint(cp)
        path = peer_checkpoints_path(self.path, cluster)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.write(fd, (cp.to_json() + "\n").encode())
        finally:
            os.close(fd)

    def close(self) -> None:
        """Write a final checkpoint (unless the head is already checkpointed) and close the files."""
        with self._lock:
            if self._closed:
                return
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                self._sync()
                if self._seq > 0 and self._seq != self._last_cp_seq and self._seq > self._stored_cp_seq():
                    self._checkpoint_locked()
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
                os.close(self._fd)
                os.close(self._rfd)
                self._closed = True

    def _stored_cp_seq(self) -> int:
        try:
            with open(checkpoints_path(self.path), "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 4096))
                lines = f.read().splitlines()
            return Checkpoint.from_json(lines[-1]).seq if lines else -1
        except (FileNotFoundError, AuditError, IndexError):
            return -1

    def __enter__(self) -> "AuditLog":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_closed", True) is False:
            try:
                self.close()
            except Exception:  # noqa: BLE001 - never raise from a finaliser
                pass


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """Result of `verify_log`: ok, number of intact records, first bad sequence number (None if ok), why."""

    ok: bool
    records: int
    first_bad: int | None
    reason: str
    checkpoints: int = 0
    last_checkpoint: int | None = None


def read_checkpoints(path: str | os.PathLike) -> list[Checkpoint]:
    """All checkpoints stored in a checkpoints file (empty if it does not exist)."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return []
    return [Checkpoint.from_json(line) for line in data.splitlines() if line.strip()]


def verify_log(path: str | os.PathLike, public_key_pem: bytes | None = None,
               witnesses: Iterable[Checkpoint] = ()) -> VerifyReport:
    """Check the hash chain and every signed checkpoint of the log at `path`; name the first bad record.

    Detects edited, deleted, inserted and reordered records, rewritten chains that no longer match a
    signed checkpoint, and truncation back past the last checkpoint. `witnesses` are extra checkpoints of
    this log held elsewhere (e.g. by a peer cluster). With `public_key_pem`, checkpoints must be signed by it.
    """
    path = Path(path)
    data = read_file(path, "audit log", AuditError, "pass the path of an existing audit log")
    try:
        cps = read_checkpoints(checkpoints_path(path))
    except AuditError as exc:
        return VerifyReport(False, 0, None, f"checkpoints file {checkpoints_path(path)}: {exc}")
    cps = cps + list(witnesses)
    by_seq: dict[int, list[Checkpoint]] = {}
    for cp in cps:
        try:
            verify_checkpoint(cp, public_key_pem)
        except AuditError as exc:
            return VerifyReport(False, 0, cp.seq, str(exc), len(cps))
        by_seq.setdefault(cp.seq, []).append(cp)
    last_cp = max(by_seq, default=None)
    lines = data.split(b"\n")
    partial = lines.pop()  # b"" when the file ends with a newline
    prev = GENESIS
    last_good_cp = 0
    n = 0
    for i, line in enumerate(lines):
        expected = i + 1
        bad = _check_line(line, expected, prev)
        if isinstance(bad, _Bad):
            return VerifyReport(False, n, expected, f"record {expected} (line {expected}): {bad}", len(cps), last_cp)
        prev = bad
        n = expected
        for cp in by_seq.get(expected, ()):
            if cp.head != prev:
                return VerifyReport(
                    False, n, last_good_cp + 1,
                    f"records {last_good_cp + 1}..{expected} were rewritten: the hash at seq {expected} does not "
                    f"match the signed checkpoint", len(cps), last_cp)
        if expected in by_seq:
            last_good_cp = expected
    if partial:
        return VerifyReport(False, n, n + 1, f"record {n + 1} (line {n + 1}) is incomplete: partial write or "
                                             f"truncated mid-record", len(cps), last_cp)
    if last_cp is not None and last_cp > n:
        return VerifyReport(False, n, n + 1, f"log ends at record {n} but a signed checkpoint covers seq {last_cp}: "
                                             f"records {n + 1}..{last_cp} were deleted (truncated)", len(cps), last_cp)
    if last_cp is None:
        note = f"{n} records, chain intact, no signed checkpoint yet (truncation cannot be detected)"
    else:
        note = f"{n} records, chain intact, last signed checkpoint at seq {last_cp}"
    return VerifyReport(True, n, None, note, len(cps), last_cp)


def _check_line(line: bytes, expected: int, prev: str) -> str:
    """The record's hash if it is intact at position `expected` after `prev`, else a `_Bad` reason."""
    try:
        rec = json.loads(line)
    except ValueError:
        return _Bad("is not valid JSON (edited or corrupted)")
    if not isinstance(rec, dict) or set(rec) != _RECORD_KEYS:
        return _Bad("does not have the record fields (edited or inserted)")
    seq = rec["seq"]
    if seq != expected:
        if isinstance(seq, int) and seq > expected:
            return _Bad(f"expected seq {expected}, found {seq}: records deleted or reordered")
        return _Bad(f"expected seq {expected}, found {seq}: record inserted, duplicated or reordered")
    claimed = rec.pop("hash")
    if rec["prev"] != prev:
        return _Bad(f"its prev hash does not match record {expected - 1}: a record before it was deleted, "
                    "inserted or edited")
    if hashlib.sha256(_canonical(rec).encode()).hexdigest() != claimed:
        return _Bad("its content does not match its hash (edited)")
    return claimed


class _Bad(str):
    """Reason a record failed (a str subclass so `_check_line` can return either a hash or a reason)."""


def read_records(path: str | os.PathLike) -> Iterator[dict]:
    """Yield the records of an audit log as dicts (no verification; use `verify_log` for that)."""
    with open(path, "rb") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except ValueError:
                raise AuditError(f"audit log {path} line {n} is not valid JSON; run audit verify") from None


def filter_records(records: Iterable[dict], *, user: str | None = None, action: str | None = None,
                   since: float | None = None, until: float | None = None,
                   outcome: str | None = None) -> Iterator[dict]:
    """Records whose actor or target is `user`, whose action is (or starts with `action.`), in [since, until)."""
    for r in records:
        if user is not None and r.get("actor") != user and r.get("target") != user:
            continue
        if action is not None and r.get("action") != action and not str(r.get("action", "")).startswith(action + "."):
            continue
        if since is not None and r.get("time", 0) < since:
            continue
        if until is not None and r.get("time", 0) >= until:
            continue
        if outcome is not None and r.get("outcome") != outcome:
            continue
        yield r
