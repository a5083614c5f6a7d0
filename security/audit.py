"""Tamper-evident audit log: hash-chained JSON-lines records with Ed25519-signed checkpoints inside the chain.

Files: `<log>` holds one record per line, each carrying `prev` (hash of the record before) and `hash`
(sha256 of its own canonical JSON without `hash`). A signed checkpoint (seq, head hash, time, signer) is
itself a record of the chain (action `audit.checkpoint`), written after the first record, after every
`checkpoint_every`-th record, when a writer finds an unsigned tail left by another, and on close: a rewrite
cannot keep them valid without the signing key, and cannot drop them without leaving a long unsigned tail,
so no file beside the log is needed to notice it. `<log>.checkpoints` keeps a copy of each checkpoint (what
is sent to peers). Checkpoints received from other clusters' switches are both kept in
`<log>.peers/<cluster>.checkpoints` and recorded in this log (`audit.peer_checkpoint`): each switch's log,
signed by its own key, holds its peers' heads, so a peer can prove what another's log said.
Verification lives in `security.audit_verify`. Several processes may append to one log: each append takes
an exclusive `flock` on the log and first catches up with records the others wrote.
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
from pathlib import Path
from typing import Iterable, Iterator

from security._text import safe_text
from security.audit_checkpoint import (CHECKPOINT_ACTION, GENESIS, PEER_CHECKPOINT_ACTION, Checkpoint,
                                       canonical, checkpoint_of_record, generate_signing_key, load_signing_key,
                                       public_key_pem, signer_field, signer_of,
                                       verify_checkpoint)
from security.errors import AuditError

__all__ = [
    "AuditLog",
    "default_actor",
    "Checkpoint",
    "GENESIS",
    "generate_signing_key",
    "public_key_pem",
    "verify_checkpoint",
    "read_records",
    "read_checkpoints",
    "filter_records",
    "checkpoints_path",
    "peer_checkpoints_path",
    "signer_of",
    "checkpoint_of_record",
    "CHECKPOINT_ACTION",
    "PEER_CHECKPOINT_ACTION",
    "safe_text",
    "FIELD_LIMIT",
]

_AUDIT_ACTOR = "audit"
PEER_RECORD_MIN_S = 1.0  # at most one peer checkpoint kept per cluster in this interval
FIELD_LIMIT = 256  # characters of a record's actor, action, target and outcome (longer ones are cut, marked)


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


class AuditLog:
    """Appender for one audit log; a context manager whose close writes a final checkpoint."""

    def __init__(self, path: str | os.PathLike, signing_key_path: str | os.PathLike,
                 checkpoint_every: int = 1000) -> None:
        if checkpoint_every < 1:
            raise ValueError(f"checkpoint_every={checkpoint_every} must be >= 1")
        self.path = Path(path)
        self.checkpoint_every = checkpoint_every
        self._key = load_signing_key(signing_key_path)
        self._signer = signer_field(self._key.public_key())
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
        self._tail_cp: Checkpoint | None = None  # the checkpoint the last record carries, if it is one
        self._caught_up = False  # whether this writer has signed (or found signed) the tail it opened on
        self._peer_last: dict[str, tuple[int, float]] = {}  # cluster -> (seq, monotonic time) last stored
        self._closed = False

    # ---- catching up with other writers (called with the flock held)
    def _sync(self) -> None:
        size = os.fstat(self._fd).st_size
        if size == self._offset:
            return
        if size == 0:
            self._seq, self._head, self._tail_cp = 0, GENESIS, None
        else:
            last = self._last_line(size)
            try:
                rec = json.loads(last)
                self._seq, self._head = int(rec["seq"]), str(rec["hash"])
                self._tail_cp = checkpoint_of_record(rec) if rec.get("action") == CHECKPOINT_ACTION else None
            except (ValueError, KeyError, TypeError, AuditError):
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

    def _write_locked(self, actor: str, action: str, target: str, outcome: str, detail: dict | None) -> int:
        seq = self._seq + 1
        body = canonical({"seq": seq, "time": round(time.time(), 6), "actor": actor, "action": action,
                           "target": target, "outcome": outcome, "detail": detail or {}, "prev": self._head})
        digest = hashlib.sha256(body.encode()).hexdigest()
        line = f'{body[:-1]},"hash":"{digest}"}}\n'.encode()
        os.write(self._fd, line)
        self._offset += len(line)
        self._seq, self._head, self._tail_cp = seq, digest, None
        return seq

    def append(self, actor: str, action: str, target: str, outcome: str = "ok",
               detail: dict | None = None) -> int:
        """Append one record and return its sequence number (a signed checkpoint record follows the first
        record and every N-th). Actor, action, target and outcome are stored as `safe_text(v, FIELD_LIMIT)`."""
        for name, value in (("actor", actor), ("action", action), ("target", target), ("outcome", outcome)):
            if not isinstance(value, str):
                raise AuditError(f"audit {name} must be a string, got {type(value).__name__}")
        if detail is not None and not isinstance(detail, dict):
            raise AuditError(f"audit detail must be a dict or None, got {type(detail).__name__}")
        if action in (CHECKPOINT_ACTION, PEER_CHECKPOINT_ACTION):
            raise AuditError(f"action {action!r} is reserved for the audit log's own signed records")
        # names often come from peers, workers or clients: kept as one bounded, printable line each
        actor, action, target, outcome = (v if len(v) <= FIELD_LIMIT and v.isprintable()
                                          else safe_text(v, FIELD_LIMIT) for v in (actor, action, target, outcome))
        with self._lock:
            if self._closed:
                raise AuditError(f"audit log {self.path} is closed")
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                self._sync()
                self._catch_up_locked()
                seq = self._write_locked(actor, action, target, outcome, detail)
                if seq == 1 or seq % self.checkpoint_every == 0:
                    self._checkpoint_locked()
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
        return seq

    def _catch_up_locked(self) -> None:
        # a writer that stopped without its closing checkpoint left an unsigned tail: sign it before adding to it,
        # so an honest log never has more than `checkpoint_every` unsigned records at its end
        if not self._caught_up:
            self._caught_up = True
            if self._seq > 0 and self._tail_cp is None:
                self._checkpoint_locked()

    def _checkpoint_locked(self) -> Checkpoint:
        if self._tail_cp is not None:  # the head is a checkpoint already: nothing new to sign
            return self._tail_cp
        cp = Checkpoint(seq=self._seq, head=self._head, time=round(time.time(), 6), signer=self._signer, signature="")
        sig = base64.b64encode(self._key.sign(cp.message())).decode()
        cp = Checkpoint(seq=cp.seq, head=cp.head, time=cp.time, signer=cp.signer, signature=sig)
        detail = json.loads(cp.to_json())
        detail["every"] = self.checkpoint_every
        self._write_locked(_AUDIT_ACTOR, CHECKPOINT_ACTION, self.path.name, "ok", detail)
        self._tail_cp = cp
        os.fsync(self._fd)
        fd = os.open(checkpoints_path(self.path), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, (cp.to_json() + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        return cp

    def checkpoint(self) -> Checkpoint:
        """Sign the current head now (as a checkpoint record); the latest checkpoint if the head is one already."""
        with self._lock:
            if self._closed:
                raise AuditError(f"audit log {self.path} is closed")
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                self._sync()
                self._caught_up = True
                if self._seq == 0:
                    raise AuditError(f"audit log {self.path} has no record to sign yet; append one first")
                return self._checkpoint_locked()
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    @property
    def seq(self) -> int:
        """Sequence number of the last record this writer knows of."""
        return self._seq

    def store_peer_checkpoint(self, cluster: str, cp: Checkpoint, *, final: bool = False,
                              in_chain: bool = True) -> None:
        """Keep a checkpoint received from `cluster` (signature checked first): beside this log and as a record in it.

        The record puts the peer's signed head into this log's own chain, which this log's next checkpoint signs:
        the two switches' heads are then cross-signed. One checkpoint per cluster is kept per PEER_RECORD_MIN_S,
        and none at or below the seq kept last, so a peer flooding checkpoints costs neither records nor signatures.
        `final` (a peer's closing checkpoint) is kept however soon after the last one; `in_chain=False` keeps it
        only beside the log (a writer that has signed its own closing checkpoint adds no record after it).
        """
        verify_checkpoint(cp)
        last = self._peer_last.get(cluster)
        now = time.monotonic()
        if last is not None and (cp.seq <= last[0] or (now - last[1] < PEER_RECORD_MIN_S and not final)):
            return  # a repeat, an older one, or one of a flood: the latest is kept at the next interval
        path = peer_checkpoints_path(self.path, cluster)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.write(fd, (cp.to_json() + "\n").encode())
        finally:
            os.close(fd)
        if not in_chain:
            self._peer_last[cluster] = (cp.seq, now)
            return
        with self._lock:
            if self._closed:
                raise AuditError(f"audit log {self.path} is closed")
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                self._sync()
                self._catch_up_locked()
                seq = self._write_locked(_AUDIT_ACTOR, PEER_CHECKPOINT_ACTION, cluster, "ok",
                                         {"checkpoint": json.loads(cp.to_json())})
                if seq % self.checkpoint_every == 0:
                    self._checkpoint_locked()
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
        self._peer_last[cluster] = (cp.seq, now)

    def close(self) -> None:
        """Write a final checkpoint (unless the head is already one) and close the files."""
        with self._lock:
            if self._closed:
                return
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                self._sync()
                if self._seq > 0:
                    self._checkpoint_locked()
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
                os.close(self._fd)
                os.close(self._rfd)
                self._closed = True

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


def read_checkpoints(path: str | os.PathLike) -> list[Checkpoint]:
    """All checkpoints stored in a checkpoints file (empty if it does not exist)."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return []
    return [Checkpoint.from_json(line) for line in data.splitlines() if line.strip()]


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

