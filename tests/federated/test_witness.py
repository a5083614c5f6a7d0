"""The controller as witness of the combiners' audit logs: checkpoints verified against the key pinned per
combiner, rewound or re-keyed ones refused and audited, the good ones kept where `audit verify --peer-dir` finds
them; through real switches, a combiner's log emptied afterwards no longer verifies against them."""
from __future__ import annotations

import json

import pytest

from nebula.federated.trail import ModelTrail
from nebula.federated.witness import PINS_FILE, CombinerWitness
from security.audit import (AuditLog, checkpoints_path, generate_signing_key, peer_checkpoints_path, public_key_pem,
                            read_checkpoints)
from security.audit_verify import verify_log
from tests.federated.harness import federation, run_job, write_job


def _log(d, name="audit.log"):
    d.mkdir(parents=True, exist_ok=True)
    key = d / "key"
    if not key.exists():
        generate_signing_key(key)
    return AuditLog(d / name, key)


@pytest.fixture
def controller(tmp_path):
    log = _log(tmp_path / "controller")
    log.append("ctl", "fl.start", "j")
    records: list[tuple] = []
    yield CombinerWitness(tmp_path / "controller", log, lambda *a: records.append(a)), log, records
    log.close()


def test_checkpoints_are_pinned_per_combiner_and_a_rewound_or_rekeyed_log_is_refused(tmp_path, controller):
    witness, log, records = controller
    comb = _log(tmp_path / "comb-A")
    comb.append("comb", "fl.combiner", "A")
    first = comb.checkpoint()
    assert witness.receive("A", first.to_json()) is None
    comb.append("comb", "fl.update", "A/2")
    later = comb.checkpoint()
    assert witness.receive("A", later.to_json(), final=True) is None  # the last one is kept, however soon
    kept = read_checkpoints(peer_checkpoints_path(log.path, "combiner-A"))
    assert [c.seq for c in kept] == [first.seq, later.seq]
    assert "rewound" in witness.receive("A", first.to_json())
    other = _log(tmp_path / "impostor")
    other.append("x", "fl.combiner", "A")
    for _ in range(9):
        other.append("x", "pad", "A")
    assert "other than the one pinned for combiner-A" in witness.receive("A", other.checkpoint().to_json())
    edited = json.loads(later.to_json())
    edited["seq"] += 5
    assert "invalid signature" in witness.receive("A", json.dumps(edited))
    assert "no checkpoint" in witness.receive("A", None)
    assert [(r[0], r[1], r[2]) for r in records] == [("fl.witness", "combiner-A", "refused")] * 4
    # a restarted controller keeps the pins
    again = CombinerWitness(tmp_path / "controller", log, lambda *a: None)
    assert "rewound" in again.receive("A", first.to_json())
    assert json.loads((tmp_path / "controller" / PINS_FILE).read_text())["combiner-A"]["seq"] == later.seq
    comb.close()
    other.close()


def test_the_controller_keeps_every_combiners_last_signed_head_and_an_emptied_combiner_log_fails(procs, tmp_path):
    workers = federation(procs, tmp_path)
    job = write_job(tmp_path, workers, {"A": 1, "B": 1}, rounds=2,
                    client={"factory": "tests.federated.toy_client:make_client",
                            "args": {"behaviours": {"B/0": "nan"}}})
    out = run_job(procs, job)
    with ModelTrail(tmp_path / "fl" / "trail") as t:
        assert [r.status for r in t.rounds()] == ["valid", "valid"], out
    controller_log = tmp_path / "fl" / "controller" / "audit.log"
    for c in "AB":
        d = tmp_path / "fl" / f"combiner-{c}"
        kept = read_checkpoints(peer_checkpoints_path(controller_log, f"combiner-{c}"))
        own = read_checkpoints(checkpoints_path(d / "audit.log"))
        # status answers and partials brought checkpoints during the run (one a second is kept), the last word
        # the final one
        assert len(kept) >= 2 and kept[-1] == own[-1], (kept, own)
        pin = public_key_pem(d / "audit_signing.key")
        report = verify_log(d / "audit.log", pin, kept)
        # (the last record is the final checkpoint's own record, which signs all before it)
        assert report.ok and report.last_checkpoint == kept[-1].seq == report.records - 1, report
        # the combiner's log and its own checkpoints file emptied: the controller's copies still tell
        (d / "audit.log").write_text("")
        checkpoints_path(d / "audit.log").unlink()
        report = verify_log(d / "audit.log", pin, kept)
        assert not report.ok, report
    records = [json.loads(x) for x in controller_log.read_text().splitlines()]
    assert {r["target"] for r in records if r["action"] == "audit.peer_checkpoint"} == {"combiner-A", "combiner-B"}
    assert not [r for r in records if r["action"] == "fl.witness"]  # nothing refused
