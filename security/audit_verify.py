"""Verification of an audit log: hash chain, the signed checkpoints inside it, outside copies and peers' witnesses.

A log is `tampered` when a record or a checkpoint is provably wrong (first bad record named), and
`suspicious` when nothing in it is provably wrong but evidence that must be there is missing: an empty log of a
writer that has run, a log without any signed checkpoint, or more unsigned records at its end than its writer
leaves (what a rewrite that dropped the checkpoints it could not re-sign looks like). The report also says how many
records follow the last checkpoint a witness holds (`witnessed`, `unwitnessed`), which `security.audit_verdict`
judges SUSPICIOUS for a writer with peers. An empty log that nothing
outside it speaks for is `unverifiable`: emptied or never written, no one can tell. Which key and which evidence
to trust is `security.audit_verdict`'s part.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from security._files import read_file
from security.audit import (CHECKPOINT_ACTION, GENESIS, Checkpoint, canonical, checkpoint_of_record,
                            checkpoints_path, read_checkpoints, signer_of, verify_checkpoint)
from security.errors import AuditError

__all__ = ["STOP_ACTIONS", "VerifyReport", "verify_log"]

# records a writer ends a clean stop with (its closing checkpoint follows): a switch, a federated combiner
STOP_ACTIONS = frozenset({"switch_stopped", "fl.stop"})
_RECORD_KEYS = frozenset({"seq", "time", "actor", "action", "target", "outcome", "detail", "prev", "hash"})


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """Result of `verify_log`: ok, intact records, first bad sequence number (None if none), why, and the verdict.

    `kind` is `ok`, `tampered` (a record or checkpoint is provably wrong), `suspicious` (evidence missing) or
    `unverifiable` (an empty log that nothing outside it speaks for).
    """

    ok: bool
    records: int
    first_bad: int | None
    reason: str
    checkpoints: int = 0
    last_checkpoint: int | None = None
    kind: str = "ok"
    witnessed: int | None = None  # the highest seq a witness (not the log's own directory) holds a checkpoint of
    unwitnessed: int = 0  # records after it (the checkpoint record that carries that very head not counted)
    clean_stop: bool = False  # the log ends with a stop record and the checkpoint that signs it


def _short(signer: str) -> str:
    return signer[:12] + "..."


def verify_log(path: str | os.PathLike, public_key_pem: bytes | None = None,
               witnesses: Iterable[Checkpoint] = (), *, signer: str | None = None, pin_source: str | None = None,
               has_run: str | None = None) -> VerifyReport:
    """Check the hash chain and every signed checkpoint of the log at `path`; name the first bad record.

    Detects edited, deleted, inserted and reordered records; chains rewritten with recomputed hashes (the
    checkpoint records inside the log no longer verify, or were dropped and leave a long unsigned tail);
    checkpoints signed by another key than the pinned one (`public_key_pem`, or `signer` as base64 raw key;
    without a pin, by another key than the log's own first checkpoint); truncation back past a checkpoint
    held outside the log (`<log>.checkpoints`, and `witnesses`, e.g. a peer cluster's copies); and an empty
    log when `has_run` says why its writer must have written something (the reason is quoted). An empty log is
    never ok: without witnesses or `has_run` it is `unverifiable`.
    """
    path = Path(path)
    data = read_file(path, "audit log", AuditError, "pass the path of an existing audit log")
    pin = signer_of(public_key_pem) if public_key_pem is not None else signer
    source = pin_source or ("--key" if public_key_pem is not None else "the pinned key")
    try:
        outside = read_checkpoints(checkpoints_path(path))
    except AuditError as exc:
        return VerifyReport(False, 0, None, f"checkpoints file {checkpoints_path(path)}: {exc}", kind="tampered")
    witnesses = list(witnesses)
    outside += witnesses

    lines = data.split(b"\n")
    partial = lines.pop()  # b"" when the file ends with a newline
    hashes = [GENESIS]
    signed: list[int] = []  # seqs covered by a checkpoint that matched (inside the log or outside it)
    inside = 0
    last_inside_record = 0  # seq of the last checkpoint record
    every = 0
    first_signer = pin
    actions: list[str] = []  # each record's action, by seq - 1

    def bad(first: int | None, reason: str, kind: str = "tampered") -> VerifyReport:
        return VerifyReport(False, len(hashes) - 1, first, reason, inside + len(outside), max(signed, default=None),
                            kind)

    for i, line in enumerate(lines):
        expected = i + 1
        checked = _check_line(line, expected, hashes[-1])
        if isinstance(checked, _Bad):
            return bad(expected, f"record {expected} (line {expected}): {checked}")
        digest, rec = checked
        if rec["action"] == CHECKPOINT_ACTION:
            try:
                cp = checkpoint_of_record(rec)
                assert cp is not None
                verify_checkpoint(cp)
            except AuditError as exc:
                return bad(expected, f"record {expected} is a checkpoint that does not verify: {exc}")
            if first_signer is None:
                first_signer = cp.signer
            if cp.signer != first_signer:
                why = (f"a different key than the one pinned ({source})" if pin is not None else
                       f"key {_short(cp.signer)}, not the key {_short(first_signer)} of the log's earlier checkpoints")
                return bad(expected, f"record {expected} is a checkpoint signed by {why}: the log was re-signed")
            if cp.seq != expected - 1 or cp.head != hashes[-1]:
                start = max(signed, default=0) + 1
                return bad(start, f"records {start}..{expected - 1} were rewritten: the signed checkpoint in record "
                                  f"{expected} covers another head")
            n_every = rec["detail"].get("every")
            if not isinstance(n_every, int) or isinstance(n_every, bool) or n_every < 1:
                return bad(expected, f"record {expected} is a checkpoint without a valid 'every' (edited)")
            every = max(every, n_every)
            inside += 1
            last_inside_record = expected
            signed.append(expected - 1)
        hashes.append(digest)
        actions.append(str(rec["action"]))
    n = len(hashes) - 1
    if partial:
        return bad(n + 1, f"record {n + 1} (line {n + 1}) is incomplete: partial write or truncated mid-record")

    for cp in sorted(outside, key=lambda c: c.seq):
        try:
            verify_checkpoint(cp)
        except AuditError as exc:
            return bad(cp.seq, str(exc))
        if first_signer is None:
            first_signer = cp.signer
        if cp.signer != first_signer:
            why = (f"a different key than the one pinned ({source})" if pin is not None else
                   f"key {_short(cp.signer)}, not the key {_short(first_signer)} of the log's checkpoints")
            return bad(cp.seq, f"checkpoint at seq {cp.seq} (held outside the log) was signed by {why}")
        if cp.seq > n:
            return bad(n + 1, f"log ends at record {n} but a signed checkpoint held outside it covers seq {cp.seq}: "
                              f"records {n + 1}..{cp.seq} were deleted (truncated)")
        if cp.head != hashes[cp.seq]:
            start = max((s for s in signed if s < cp.seq), default=0) + 1
            return bad(start, f"records {start}..{cp.seq} were rewritten: the hash at seq {cp.seq} does not match "
                              f"the signed checkpoint held outside the log")
        signed.append(cp.seq)

    if n == 0:
        if has_run or outside:
            why = has_run or f"{len(outside)} checkpoints of it are held outside the log"
            return bad(None, f"the log is empty although {why}: its records were deleted", "suspicious")
        return VerifyReport(False, 0, None, "0 records, and no witness holds a checkpoint of it and nothing says "
                                            "its writer has run: emptied or never written, no one can tell",
                            kind="unverifiable")
    if inside == 0:
        return bad(1, f"{n} records and no signed checkpoint record among them; the audit log signs one right after "
                      f"its first record, so the log was rewritten (or not written by an audit log)", "suspicious")
    tail = n - last_inside_record
    if tail > every:
        return bad(last_inside_record + 1,
                   f"records {last_inside_record + 1}..{n} ({tail}) follow the last signed checkpoint (record "
                   f"{last_inside_record}), more than its writer leaves unsigned ({every}): checkpoints were dropped "
                   f"and the records after them rewritten", "suspicious")
    pinned = f"signed by {source}" if pin is not None else f"signed by key {_short(first_signer or '')} (not pinned)"
    unsigned = f", {tail} unsigned at the end" if tail else ""
    witnessed = max((cp.seq for cp in witnesses), default=None)
    unwitnessed = 0
    if witnessed is not None:
        # the record after the witnessed head is the checkpoint that carries it (what the witness was sent)
        carried = witnessed < n and actions[witnessed] == CHECKPOINT_ACTION
        unwitnessed = n - witnessed - (1 if carried else 0)
    clean = n >= 2 and actions[-1] == CHECKPOINT_ACTION and actions[-2] in STOP_ACTIONS
    return VerifyReport(True, n, None, f"{n} records, chain intact, {inside} checkpoints in the log {pinned}, "
                                       f"{len(outside)} held outside it{unsigned}",
                        inside + len(outside), max(signed, default=None), witnessed=witnessed,
                        unwitnessed=unwitnessed, clean_stop=clean)


class _Bad(str):
    """Reason a record failed (a str subclass so `_check_line` can return either a result or a reason)."""


def _check_line(line: bytes, expected: int, prev: str) -> tuple[str, dict] | _Bad:
    """(hash, record) if the record is intact at position `expected` after `prev`, else a `_Bad` reason."""
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
    if hashlib.sha256(canonical(rec).encode()).hexdigest() != claimed:
        return _Bad("its content does not match its hash (edited)")
    if not isinstance(rec["detail"], dict):
        return _Bad("its detail is not an object (edited)")
    return claimed, rec
