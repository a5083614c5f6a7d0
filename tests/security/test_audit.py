"""Audit log: chain and checkpoints; every kind of tampering is found and the first bad record named."""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from security.audit import (AuditLog, Checkpoint, checkpoints_path, filter_records, generate_signing_key,
                            peer_checkpoints_path, public_key_pem, read_checkpoints, read_records,
                            verify_checkpoint, verify_log)
from security.errors import AuditError


@pytest.fixture
def key(tmp_path: Path) -> Path:
    path = tmp_path / "audit_signing.key"
    generate_signing_key(path)
    return path


def make_log(tmp_path: Path, key: Path, n: int = 12, every: int = 5) -> Path:
    log = tmp_path / "audit.log"
    with AuditLog(log, key, checkpoint_every=every) as audit:
        for i in range(n):
            audit.append(f"user{i % 3}", "data.read" if i % 2 else "grant.add", f"res{i}", detail={"i": i})
    return log


def lines(log: Path) -> list[bytes]:
    return log.read_bytes().splitlines(keepends=True)


def test_records_chain_and_checkpoints_every_n_and_on_close(tmp_path, key):
    log = make_log(tmp_path, key, n=12, every=5)
    recs = list(read_records(log))
    assert [r["seq"] for r in recs] == list(range(1, 13))
    assert recs[0]["prev"] == "0" * 64 and all(recs[i]["prev"] == recs[i - 1]["hash"] for i in range(1, 12))
    assert {"time", "actor", "action", "target", "outcome", "detail"} <= set(recs[0])
    cps = read_checkpoints(checkpoints_path(log))
    assert [c.seq for c in cps] == [5, 10, 12]
    assert cps[-1].head == recs[-1]["hash"]
    report = verify_log(log, public_key_pem(key))
    assert report.ok and report.records == 12 and report.first_bad is None and report.last_checkpoint == 12


def test_checkpoint_json_round_trip_and_bad_signature(key, tmp_path):
    with AuditLog(tmp_path / "a.log", key) as audit:
        audit.append("alice", "login", "alice")
        cp = audit.checkpoint()
    assert Checkpoint.from_json(cp.to_json()) == cp
    verify_checkpoint(cp, public_key_pem(key))
    forged = Checkpoint(seq=cp.seq + 1, head=cp.head, time=cp.time, signer=cp.signer, signature=cp.signature)
    with pytest.raises(AuditError, match="invalid signature"):
        verify_checkpoint(forged)
    other = tmp_path / "other.key"
    with pytest.raises(AuditError, match="different key"):
        verify_checkpoint(cp, generate_signing_key(other))
    with pytest.raises(AuditError, match="malformed"):
        Checkpoint.from_json("{not json")


def test_edited_record_is_named(tmp_path, key):
    log = make_log(tmp_path, key)
    ls = lines(log)
    ls[6] = ls[6].replace(b'"actor":"user0"', b'"actor":"mallory"')
    log.write_bytes(b"".join(ls))
    report = verify_log(log)
    assert not report.ok and report.first_bad == 7 and "edited" in report.reason and report.records == 6


def test_deleted_record_is_named(tmp_path, key):
    log = make_log(tmp_path, key)
    ls = lines(log)
    del ls[3]
    log.write_bytes(b"".join(ls))
    report = verify_log(log)
    assert not report.ok and report.first_bad == 4 and "deleted" in report.reason


def test_inserted_record_is_named(tmp_path, key):
    log = make_log(tmp_path, key)
    ls = lines(log)
    ls.insert(8, ls[2])  # a replayed copy of record 3
    log.write_bytes(b"".join(ls))
    report = verify_log(log)
    assert not report.ok and report.first_bad == 9 and "inserted" in report.reason


def test_reordered_records_are_named(tmp_path, key):
    log = make_log(tmp_path, key)
    ls = lines(log)
    ls[4], ls[5] = ls[5], ls[4]
    log.write_bytes(b"".join(ls))
    report = verify_log(log)
    assert not report.ok and report.first_bad == 5 and "reordered" in report.reason


def test_truncation_back_past_a_checkpoint_is_found(tmp_path, key):
    log = make_log(tmp_path, key, n=12, every=5)
    log.write_bytes(b"".join(lines(log)[:7]))
    report = verify_log(log)
    assert not report.ok and report.first_bad == 8 and "truncated" in report.reason and report.records == 7
    # cutting a record in half is found too
    log.write_bytes(b"".join(lines(log)[:6]) + lines(log)[6][:20])
    report = verify_log(log)
    assert not report.ok and report.first_bad == 7 and "incomplete" in report.reason


def test_rewritten_chain_with_recomputed_hashes_fails_the_signed_checkpoint(tmp_path, key):
    log = make_log(tmp_path, key, n=12, every=5)
    recs = [json.loads(l) for l in lines(log)]
    recs[6]["outcome"] = "denied"
    prev = recs[5]["hash"]
    out = []
    for r in recs[6:]:  # the attacker recomputes every hash after the edit: the chain alone looks fine
        r.pop("hash")
        r["prev"] = prev
        body = json.dumps(r, sort_keys=True, separators=(",", ":"))
        prev = hashlib.sha256(body.encode()).hexdigest()
        out.append(body[:-1] + f',"hash":"{prev}"}}\n')
    log.write_bytes(b"".join(lines(log)[:6]) + "".join(out).encode())
    report = verify_log(log)
    assert not report.ok and report.first_bad == 6 and "rewritten" in report.reason and "checkpoint" in report.reason


def test_edited_checkpoint_and_foreign_signer_are_found(tmp_path, key):
    log = make_log(tmp_path, key)
    cpf = checkpoints_path(log)
    original = cpf.read_bytes()
    cp = json.loads(original.splitlines()[0])
    cp["seq"] = 4
    cpf.write_bytes(json.dumps(cp).encode() + b"\n" + b"\n".join(original.splitlines()[1:]) + b"\n")
    report = verify_log(log)
    assert not report.ok and "invalid signature" in report.reason
    cpf.write_bytes(original)
    other = generate_signing_key(tmp_path / "other.key")
    report = verify_log(log, other)
    assert not report.ok and "different key" in report.reason


def test_peer_checkpoints_witness_truncation_of_both_files(tmp_path, key):
    log = make_log(tmp_path, key, n=12, every=5)
    cps = read_checkpoints(checkpoints_path(log))
    peer_key = tmp_path / "peer.key"
    generate_signing_key(peer_key)
    with AuditLog(tmp_path / "peer.log", peer_key) as peer_audit:
        for cp in cps:
            peer_audit.store_peer_checkpoint("A", cp)
        with pytest.raises(AuditError, match="invalid signature"):
            peer_audit.store_peer_checkpoint("A", Checkpoint(seq=99, head=cps[0].head, time=0.0,
                                                             signer=cps[0].signer, signature=cps[0].signature))
    held = read_checkpoints(peer_checkpoints_path(tmp_path / "peer.log", "A"))
    assert held == cps
    log.write_bytes(b"".join(lines(log)[:9]))
    cpf = checkpoints_path(log)
    cpf.write_bytes(b"".join(cpf.read_bytes().splitlines(keepends=True)[:1]))
    assert verify_log(log).ok  # both local files cut consistently: only a witness can tell
    report = verify_log(log, witnesses=held)
    assert not report.ok and report.first_bad == 10 and "truncated" in report.reason


_WRITER = """
import sys
from security.audit import AuditLog
log, key, name, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
with AuditLog(log, key, checkpoint_every=50) as audit:
    for i in range(n):
        audit.append(name, "job.step", f"{name}-{i}")
"""


def test_several_writer_processes_keep_one_valid_chain(tmp_path, key):
    log = tmp_path / "shared.log"
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(log), str(key), f"w{k}", "400"])
             for k in range(3)]
    for p in procs:
        assert p.wait(timeout=120) == 0
    report = verify_log(log, public_key_pem(key))
    assert report.ok, report.reason
    assert report.records == 1200
    recs = list(read_records(log))
    for k in range(3):  # each writer's records appear in its own order
        mine = [r["target"] for r in recs if r["actor"] == f"w{k}"]
        assert mine == [f"w{k}-{i}" for i in range(400)]
    assert report.last_checkpoint == 1200


def test_filter_records_and_bad_input(tmp_path, key):
    log = make_log(tmp_path, key, n=6)
    recs = list(read_records(log))
    assert [r["seq"] for r in filter_records(recs, user="user1")] == [2, 5]
    assert [r["seq"] for r in filter_records(recs, action="data")] == [2, 4, 6]
    assert [r["seq"] for r in filter_records(recs, since=recs[3]["time"])][-3:] == [4, 5, 6]
    with pytest.raises(AuditError, match="audit signing key .*missing.key does not exist"):
        AuditLog(tmp_path / "x.log", tmp_path / "missing.key")
    with AuditLog(tmp_path / "y.log", key) as audit:
        with pytest.raises(AuditError, match="actor must be a string"):
            audit.append(None, "a", "t")  # type: ignore[arg-type]
    with pytest.raises(AuditError, match="does not exist"):
        verify_log(tmp_path / "nothing.log")
