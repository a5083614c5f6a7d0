"""Audit log: chain and checkpoints; every kind of tampering is found and the first bad record named."""
from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import pytest

from security.audit import (CHECKPOINT_ACTION, FIELD_LIMIT, PEER_CHECKPOINT_ACTION, AuditLog, Checkpoint,
                            checkpoint_of_record, checkpoints_path, filter_records, generate_signing_key,
                            peer_checkpoints_path, public_key_pem, read_checkpoints, read_records, safe_text,
                            verify_checkpoint)
from security.audit_verify import verify_log
from security.cli import main as admin
from security.errors import AuditError
from testbed.audit import forge, lines, set_outcome


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


def test_records_chain_and_signed_checkpoint_records_inside_the_log(tmp_path, key):
    log = make_log(tmp_path, key, n=12, every=5)
    recs = list(read_records(log))
    assert [r["seq"] for r in recs] == list(range(1, 17))
    assert recs[0]["prev"] == "0" * 64 and all(recs[i]["prev"] == recs[i - 1]["hash"] for i in range(1, 16))
    assert {"time", "actor", "action", "target", "outcome", "detail"} <= set(recs[0])
    # a signed checkpoint record follows the first record and every 5th; each signs the head before it
    inside = [r for r in recs if r["action"] == CHECKPOINT_ACTION]
    assert [r["seq"] for r in inside] == [2, 6, 11, 16]
    for r in inside:
        cp = checkpoint_of_record(r)
        verify_checkpoint(cp, public_key_pem(key))
        assert cp.seq == r["seq"] - 1 and cp.head == recs[r["seq"] - 2]["hash"] and r["detail"]["every"] == 5
    assert [c.seq for c in read_checkpoints(checkpoints_path(log))] == [1, 5, 10, 15]  # the copies beside it
    report = verify_log(log, public_key_pem(key))
    assert report.ok and report.kind == "ok" and report.records == 16 and report.first_bad is None
    assert report.last_checkpoint == 15
    with AuditLog(log, key, checkpoint_every=5) as audit:  # closing signs an unsigned tail
        audit.append("user0", "job.start", "j")
    assert [r["action"] for r in read_records(log)][-2:] == ["job.start", CHECKPOINT_ACTION]
    assert verify_log(log).ok


def test_checkpoint_json_round_trip_and_bad_signature(key, tmp_path):
    with AuditLog(tmp_path / "a.log", key) as audit:
        audit.append("alice", "login", "alice")
        cp = audit.checkpoint()
    assert Checkpoint.from_json(cp.to_json()) == cp
    verify_checkpoint(cp, public_key_pem(key))
    forged = Checkpoint(seq=cp.seq + 1, head=cp.head, time=cp.time, signer=cp.signer, signature=cp.signature)
    for _ in range(2):  # (verdicts are remembered by value: the valid one's never stands for an edited one)
        with pytest.raises(AuditError, match="invalid signature"):
            verify_checkpoint(forged)
        verify_checkpoint(cp)
    short = Checkpoint(seq=cp.seq, head=cp.head, time=cp.time, signer=base64.b64encode(b"k" * 31).decode(),
                       signature=cp.signature)
    with pytest.raises(AuditError, match="malformed signer or signature"):
        verify_checkpoint(short)
    other = tmp_path / "other.key"
    with pytest.raises(AuditError, match="different key"):
        verify_checkpoint(cp, generate_signing_key(other))
    with pytest.raises(AuditError, match="malformed"):
        Checkpoint.from_json("{not json")


def test_edited_record_is_named(tmp_path, key):
    log = make_log(tmp_path, key)
    ls = lines(log)
    ls[6] = ls[6].replace(b'"outcome":"ok"', b'"outcome":"denied"')
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


def verify_cli(capsys, log: Path, *extra: str) -> tuple[int, str]:
    code = admin(["audit", "verify", "--log", str(log), *extra])
    return code, capsys.readouterr().out


def test_rewritten_chain_with_recomputed_hashes_fails_the_checkpoints_inside_the_log(tmp_path, key, capsys):
    log = make_log(tmp_path, key, n=12, every=5)
    forge(log, set_outcome(7, "denied"))  # the attacker recomputes every hash and deletes <log>.checkpoints
    report = verify_log(log)
    assert not report.ok and report.kind == "tampered" and report.first_bad == 6 and "rewritten" in report.reason
    code, out = verify_cli(capsys, log, "--key", str(key))
    assert code == 1 and out.startswith("TAMPERED") and "checkpoint in record 11 covers another head" in out


def test_rewrite_that_drops_every_checkpoint_and_their_copies_is_suspicious(tmp_path, key, capsys):
    log = make_log(tmp_path, key, n=12, every=5)
    forge(log, set_outcome(7, "denied"), drop_checkpoints_after=0)
    report = verify_log(log, public_key_pem(key))
    assert not report.ok and report.kind == "suspicious" and "no signed checkpoint record" in report.reason
    code, out = verify_cli(capsys, log, "--key", str(key))
    assert code == 3 and out.startswith("SUSPICIOUS") and "was rewritten" in out


def test_rewrite_cut_back_to_an_early_checkpoint_leaves_a_long_unsigned_tail(tmp_path, key, capsys):
    log = make_log(tmp_path, key, n=12, every=5)
    # keep the checkpoint record at seq 6 (it still matches), rewrite after it, drop the later checkpoint records
    # and cut <log>.checkpoints back to the checkpoints up to seq 5
    forge(log, set_outcome(9, "denied"), drop_checkpoints_after=6, keep_checkpoint_file=2)
    report = verify_log(log, public_key_pem(key))
    assert not report.ok and report.kind == "suspicious" and report.first_bad == 7
    assert "records 7..14 (8) follow the last signed checkpoint" in report.reason
    code, out = verify_cli(capsys, log)
    assert code == 3 and "SUSPICIOUS" in out and "checkpoints were dropped" in out


def test_resigned_with_another_key_is_caught_by_the_key_beside_the_log(tmp_path, key, capsys):
    log = make_log(tmp_path, key, n=12, every=5)
    mallory = tmp_path / "mallory" / "k.key"
    generate_signing_key(mallory)
    forge(log, set_outcome(3, "denied"), resign=mallory)
    assert verify_log(log).ok  # self-consistent: only a pin can tell
    code, out = verify_cli(capsys, log)  # the pin comes from audit_signing.key beside the log, by default
    assert code == 1 and out.startswith("TAMPERED") and "different key than the one pinned" in out
    assert "audit_signing.key" in out
    code, out = verify_cli(capsys, log, "--key", str(mallory))  # the admin's pin, but the key beside disagrees
    assert code == 3 and out.startswith("SUSPICIOUS") and "pinned keys disagree" in out
    code, out = verify_cli(capsys, log, "--key", str(mallory), "--no-discover")  # the admin's pin alone
    assert code == 0 and out.startswith("OK") and f"key pinned from --key {mallory}" in out


def test_empty_log_is_suspicious_when_its_writer_has_run(tmp_path, key, capsys):
    log = make_log(tmp_path, key, n=3)
    log.write_bytes(b"")
    report = verify_log(log)  # the checkpoints beside it still cover seq 3
    assert not report.ok and "deleted" in report.reason
    checkpoints_path(log).unlink()
    report = verify_log(log)  # nothing left that says anything was ever written: emptied or fresh, no one can tell
    assert not report.ok and report.kind == "unverifiable"
    code, out = verify_cli(capsys, log)  # the key beside pins it, but an emptied log is never OK on its own
    assert code == 4 and out.startswith("UNVERIFIABLE") and "fix: pass --peer-dir" in out
    report = verify_log(log, has_run="switch A has started (state/epoch holds boot epoch 2)")
    assert not report.ok and "switch A has started" in report.reason  # ... and its writer's state says it ran
    (tmp_path / "accounts.db").write_bytes(b"")  # an account store beside the log has audited every change
    code, out = verify_cli(capsys, log)
    assert code == 3 and out.startswith("SUSPICIOUS") and "account store" in out
    fresh = tmp_path / "fresh" / "audit.log"
    fresh.parent.mkdir()
    fresh.write_bytes(b"")
    code, out = verify_cli(capsys, fresh)
    assert code == 4 and out.startswith("UNVERIFIABLE") and len(out.splitlines()) == 1


def test_honest_log_verifies_from_the_cli_with_the_key_pinned_by_default(tmp_path, key, capsys):
    log = make_log(tmp_path, key, n=40, every=10)
    with AuditLog(log, key, checkpoint_every=10) as audit:
        audit.append("alice", "login", "alice")
    code, out = verify_cli(capsys, log)
    assert code == 0 and out.startswith("OK") and "key pinned from" in out and "audit_signing.key" in out
    code, out = verify_cli(capsys, log, "--no-discover")  # nothing pins its key: intact, but not OK
    assert code == 4 and out.startswith("UNVERIFIABLE") and "no pinned key" in out and "fix: pass" in out
    code, out = verify_cli(capsys, log, "--no-discover", "--key", str(key))
    assert code == 0 and out.startswith("OK")


def test_unsigned_tail_of_a_crashed_writer_is_signed_by_the_next_writer(tmp_path, key):
    log = make_log(tmp_path, key, n=4, every=5)
    ls = lines(log)
    # a writer killed before its closing checkpoint: records 6..9 follow the checkpoint at 5, no checkpoint after
    with AuditLog(log, key, checkpoint_every=5) as audit:
        for i in range(3):
            audit.append("w", "job.step", str(i))
        n_before = audit.seq
        audit._closed = True  # simulate the kill: no closing checkpoint
    assert len(lines(log)) == n_before and len(ls) < n_before
    with AuditLog(log, key, checkpoint_every=5) as audit:
        audit.append("w", "job.step", "after restart")
    recs = list(read_records(log))
    assert recs[n_before]["action"] == CHECKPOINT_ACTION  # signed before anything was added
    assert verify_log(log, public_key_pem(key)).ok


def test_peer_checkpoints_are_kept_beside_and_inside_the_peers_log_and_witness_truncation(tmp_path, key,
                                                                                          monkeypatch):
    import security.audit
    monkeypatch.setattr(security.audit, "PEER_RECORD_MIN_S", 0.0)  # keep every one (no flood here)
    log = make_log(tmp_path, key, n=12, every=5)
    cps = read_checkpoints(checkpoints_path(log))
    peer_key = tmp_path / "peer.key"
    generate_signing_key(peer_key)
    with AuditLog(tmp_path / "peer.log", peer_key) as peer_audit:
        peer_audit.append("switch:B", "switch_started", "B")
        for cp in cps + cps[:1]:  # a repeat (or an older one) is not recorded again
            peer_audit.store_peer_checkpoint("A", cp)
        with pytest.raises(AuditError, match="invalid signature"):
            peer_audit.store_peer_checkpoint("A", Checkpoint(seq=99, head=cps[0].head, time=0.0,
                                                             signer=cps[0].signer, signature=cps[0].signature))
        with pytest.raises(AuditError, match="reserved"):
            peer_audit.append("x", CHECKPOINT_ACTION, "y")
    held = read_checkpoints(peer_checkpoints_path(tmp_path / "peer.log", "A"))
    assert held == cps
    inside = [checkpoint_of_record(r) for r in read_records(tmp_path / "peer.log")
              if r["action"] == PEER_CHECKPOINT_ACTION]
    assert inside == cps
    assert verify_log(tmp_path / "peer.log", public_key_pem(peer_key)).ok  # the peer's own key signs them
    # both local files cut back consistently to the checkpoint at seq 5 (record 6): only a witness can tell
    log.write_bytes(b"".join(lines(log)[:6]))
    cpf = checkpoints_path(log)
    cpf.write_bytes(b"".join(cpf.read_bytes().splitlines(keepends=True)[:2]))
    assert verify_log(log).ok
    report = verify_log(log, witnesses=held)
    assert not report.ok and report.first_bad == 7 and "truncated" in report.reason


def test_a_flood_of_peer_checkpoints_costs_one_record_and_no_new_signature(tmp_path, key):
    log = make_log(tmp_path, key, n=200, every=1)  # 200 distinct, validly signed checkpoints of A
    cps = read_checkpoints(checkpoints_path(log))
    peer_key = tmp_path / "peer.key"
    generate_signing_key(peer_key)
    with AuditLog(tmp_path / "peer.log", peer_key) as peer_audit:
        peer_audit.append("switch:B", "switch_started", "B")
        first = peer_audit.checkpoint()
        peer_audit.store_peer_checkpoint("A", cps[0])
        answer = peer_audit.checkpoint()  # what the switch sends back: a new head is signed once
        n = peer_audit.seq
        for cp in cps[1:]:
            peer_audit.store_peer_checkpoint("A", cp)
            assert peer_audit.checkpoint() == answer  # nothing new to sign while the flood is dropped
        assert peer_audit.seq == n and answer != first
    assert len(read_checkpoints(peer_checkpoints_path(tmp_path / "peer.log", "A"))) == 1


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
    assert sum(r["action"] == "job.step" for r in read_records(log)) == 1200
    recs = list(read_records(log))
    for k in range(3):  # each writer's records appear in its own order
        mine = [r["target"] for r in recs if r["actor"] == f"w{k}"]
        assert mine == [f"w{k}-{i}" for i in range(400)]
    assert report.last_checkpoint == report.records - 1  # the last writer's close signed the head


def test_filter_records_and_bad_input(tmp_path, key):
    log = make_log(tmp_path, key, n=6)
    recs = list(read_records(log))
    assert [r["seq"] for r in filter_records(recs, user="user1")] == [3, 7]
    assert [r["seq"] for r in filter_records(recs, action="data")] == [3, 5, 8]
    assert [r["seq"] for r in filter_records(recs, since=recs[3]["time"])][:3] == [4, 5, 6]
    with pytest.raises(AuditError, match="audit signing key .*missing.key does not exist"):
        AuditLog(tmp_path / "x.log", tmp_path / "missing.key")
    with AuditLog(tmp_path / "y.log", key) as audit:
        with pytest.raises(AuditError, match="actor must be a string"):
            audit.append(None, "a", "t")  # type: ignore[arg-type]
    with pytest.raises(AuditError, match="does not exist"):
        verify_log(tmp_path / "nothing.log")


def test_audit_show_prints_one_escaped_line_per_record_whatever_names_it_holds(tmp_path, key, capsys):
    log = tmp_path / "audit.log"
    forged = "mallory\n   7  2030-01-01T00:00:00Z  admin  grant.add  alice:data  ok\x1b[2K\u202e" + "m" * 2000
    with AuditLog(log, key) as audit:
        audit.append(forged, "login", forged, "failed", {"why": forged})
        audit.append("alice", "login", "alice")
    recs = list(read_records(log))  # stored bounded and printable; details keep the exact value (JSON escapes it)
    assert recs[0]["actor"] == recs[0]["target"] == safe_text(forged, FIELD_LIMIT)
    assert recs[0]["detail"]["why"] == forged
    assert len(recs[0]["actor"]) <= FIELD_LIMIT and recs[0]["actor"].startswith(r"mallory\n   7  2030")
    # a record holding the raw name (another writer's, or one from before names were bounded) shows escaped too
    forge(log, lambda rs: [dict(r, actor=forged) if r["seq"] == 1 else r for r in rs])
    code = admin(["audit", "show", "--log", str(log)])
    out = capsys.readouterr().out
    rows = out.splitlines()
    assert code == 0 and len(rows) == 3 and rows[0].startswith("SEQ")  # header + 2 records, no forged third row
    assert "\x1b" not in out and "\u202e" not in out and all(r.isprintable() for r in rows)
    assert r"mallory\n   7  2030" in rows[1] and "chars)" in rows[1] and len(rows[1]) < 1500
    code = admin(["audit", "show", "--log", str(log), "--json"])
    shown = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert code == 0 and [r["actor"] for r in shown] == [forged, "alice"]  # --json: the exact value, JSON-escaped
