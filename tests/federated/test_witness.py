"""The controller as witness of the combiners' audit logs: checkpoints verified against the key pinned per
combiner, rewound or re-keyed ones refused and audited, the good ones kept where `audit verify --peer-dir` finds
them; through real switches, a combiner's log emptied afterwards no longer verifies against them."""
from __future__ import annotations

import json

import pytest

from nebula.federated.controller.trail import ModelTrail
from nebula.federated.controller.witness import PINS_FILE, CombinerWitness
from security.audit import (AuditLog, checkpoints_path, generate_signing_key, peer_checkpoints_path, public_key_pem,
                            read_checkpoints)
from security.audit_verify import verify_log
from testbed.fedjob import federation, run_job, write_job


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
                    client={"factory": "testbed.toy_client:make_client",
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


def test_a_combiner_stopped_by_sigterm_mid_run_sends_its_closing_checkpoint_and_its_tail_verifies(procs, tmp_path):
    """Combiner B in its own process gets SIGTERM while the job runs: it audits the stop, sends the controller its
    final signed head and exits 0; the controller keeps that checkpoint, so B's whole log, the stop included,
    verifies against the controller's copies (no unwitnessed tail). SIGTERM to the controller's process then ends
    the run with its status saying why."""
    import signal
    import time

    from testbed.fedjob import start_cluster, start_clients, wait_exit

    workers = federation(procs, tmp_path)
    job = write_job(tmp_path, workers, {"A": 1, "B": 1}, rounds=200, validity={"min_updates": 1})
    ctl = start_cluster(procs, job, "A")
    comb_b = start_cluster(procs, job, "B", role="combiner")
    start_clients(procs, job, "A")
    start_clients(procs, job, "B")
    trail, deadline = tmp_path / "fl" / "trail", time.monotonic() + 120
    while time.monotonic() < deadline:
        if (trail / "trail.db").exists():
            with ModelTrail(trail) as t:
                if len(t.rounds()) >= 2:
                    break
        assert ctl.poll() is None and comb_b.poll() is None, "an actor stopped before the test's SIGTERM"
        time.sleep(0.2)
    else:
        raise AssertionError("two rounds did not finish within 120 s")
    comb_b.send_signal(signal.SIGTERM)
    out = wait_exit(comb_b, 60)
    assert "combiner B done" in out and "stopped by SIGTERM" in out, out[-2000:]
    d = tmp_path / "fl" / "combiner-B"
    records = [json.loads(x) for x in (d / "audit.log").read_text().splitlines()]
    stop = [r for r in records if r["action"] == "fl.stop"]
    assert stop and stop[-1]["outcome"] == "terminated", stop
    own = read_checkpoints(checkpoints_path(d / "audit.log"))
    kept_path = peer_checkpoints_path(tmp_path / "fl" / "controller" / "audit.log", "combiner-B")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (kept_path.exists() and read_checkpoints(kept_path)[-1] == own[-1]):
        time.sleep(0.2)
    kept = read_checkpoints(kept_path)
    assert kept[-1] == own[-1], (kept[-1], own[-1])
    report = verify_log(d / "audit.log", public_key_pem(d / "audit_signing.key"), kept)
    assert report.ok and report.last_checkpoint == kept[-1].seq == report.records - 1, report
    ctl.send_signal(signal.SIGTERM)  # the controller's process (with combiner A) stops cleanly too, and says so
    wait_exit(ctl, 60)
    status = json.loads((tmp_path / "fl" / "status.json").read_text())
    assert status["state"] == "stopped" and status["reason"] == "stopped by SIGTERM", status


def test_a_new_key_and_a_runs_last_checkpoint_are_pinned_on_disk_at_once_a_rising_seq_once_per_interval(tmp_path):
    """The pins file (what a restarted controller checks against) gets a combiner's key with its first checkpoint
    and the run's last seq with its last checkpoint; between them a rising seq is written at most once per
    `save_every_s`, and refused rewinds are refused from memory meanwhile."""
    log = _log(tmp_path / "controller")
    log.append("ctl", "fl.start", "j")
    witness = CombinerWitness(tmp_path / "controller", log, lambda *a: None, save_every_s=3600)
    comb = _log(tmp_path / "comb-B")

    def pinned() -> int:
        return json.loads((tmp_path / "controller" / PINS_FILE).read_text())["combiner-B"]["seq"]

    comb.append("comb", "fl.combiner", "B")
    first = comb.checkpoint()
    assert witness.receive("B", first.to_json()) is None
    assert pinned() == first.seq  # a key seen for the first time: on disk before the message is taken
    comb.append("comb", "fl.update", "B/2")
    second = comb.checkpoint()
    assert witness.receive("B", second.to_json()) is None
    assert pinned() == first.seq  # within the interval: held in memory...
    assert "rewound" in witness.receive("B", first.to_json())  # ...and checked from there
    comb.append("comb", "fl.update", "B/3")
    last = comb.checkpoint()
    assert witness.receive("B", last.to_json(), final=True) is None
    assert pinned() == last.seq
    eager = CombinerWitness(tmp_path / "controller", log, lambda *a: None, save_every_s=0)
    assert "rewound" in eager.receive("B", second.to_json())  # (a restarted controller: from the file)
    comb.append("comb", "fl.update", "B/4")
    nxt = comb.checkpoint()
    assert eager.receive("B", nxt.to_json()) is None
    assert pinned() == nxt.seq  # no interval: every rise written
    comb.close()
    log.close()
