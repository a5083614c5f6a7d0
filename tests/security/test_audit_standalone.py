"""Standalone audit logs of a federated job (combiners, controller: `<workdir>/audit.log` with `audit_signing.key`
beside it) get witnesses too: the controller keeps each combiner's signed checkpoints in its own log
(`store_peer_checkpoint("combiner-<cluster>", cp)`), and `audit verify` finds them beside the combiner's workdir or
in `--peer-dir`, so a combiner's log cannot be emptied, cut back or re-signed undetected."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import security.audit
from security.audit import AuditLog, checkpoints_path, generate_signing_key, read_checkpoints, read_records
from security.cli import main as admin
from testbed.audit import forge, lines, set_outcome

OK, TAMPERED, UNVERIFIABLE = 0, 1, 4


def _actor_log(workdir: Path) -> AuditLog:
    """A federated actor's log as the job opens it: its own key in its workdir."""
    workdir.mkdir(parents=True, exist_ok=True)
    if not (workdir / "audit_signing.key").exists():
        generate_signing_key(workdir / "audit_signing.key")
    return AuditLog(workdir / "audit.log", workdir / "audit_signing.key")


@pytest.fixture
def job(tmp_path, monkeypatch) -> Path:
    """A job directory after 3 rounds: combiners A and B sent the controller a signed head after each round."""
    monkeypatch.setattr(security.audit, "PEER_RECORD_MIN_S", 0.0)  # rounds here are milliseconds apart
    d = tmp_path / "job"
    controller = _actor_log(d / "controller")
    combiners = {c: _actor_log(d / f"combiner-{c}") for c in ("A", "B")}
    controller.append("nebula@A/0:controller", "job.start", "langid")
    for rnd in range(3):
        for c, log in combiners.items():
            for k in range(4):
                log.append(f"nebula@{c}/1:combiner", "update.accepted", f"client-{k}", "ok", {"round": rnd})
            controller.store_peer_checkpoint(f"combiner-{c}", log.checkpoint())
        controller.append("nebula@A/0:controller", "round.done", "langid", "ok", {"round": rnd})
    for log in (controller, *combiners.values()):
        log.close()
    return d


def verify(capsys, log: Path, *extra: str) -> tuple[int, str]:
    code = admin(["audit", "verify", "--log", str(log), *extra])
    out = capsys.readouterr().out
    assert len(out.splitlines()) == 1, out
    return code, out


def test_the_controller_witnesses_each_combiners_log(job, capsys):
    held = read_checkpoints(job / "controller" / "audit.log.peers" / "combiner-A.checkpoints")
    assert len(held) == 3 and held[-1].seq == len(lines(job / "combiner-A" / "audit.log")) - 1  # the last head
    assert sum(r["target"] == "combiner-A" for r in read_records(job / "controller" / "audit.log")
               if r["action"] == "audit.peer_checkpoint") == 3  # and inside the controller's own signed chain
    code, out = verify(capsys, job / "combiner-A" / "audit.log")  # the controller's workdir is found beside it
    assert code == OK and out.startswith("OK") and "from peer controller" in out, out
    assert "the signer of the checkpoints peer controller kept" in out


def test_an_emptied_combiner_log_is_caught(job, capsys):
    log = job / "combiner-A" / "audit.log"
    log.write_bytes(b"")
    checkpoints_path(log).unlink()
    code, out = verify(capsys, log)
    assert code == TAMPERED and out.startswith("TAMPERED") and "were deleted" in out
    elsewhere = Path(shutil.move(job / "controller", job.parent / "controller-host"))
    code, out = verify(capsys, log)  # nothing outside speaks for it: never OK
    assert code == UNVERIFIABLE and out.startswith("UNVERIFIABLE") and "an empty log is never OK" in out
    code, out = verify(capsys, log, "--peer-dir", str(elsewhere))  # the controller's workdir, from its host
    assert code == TAMPERED and "were deleted" in out and "from peer controller" in out


def test_a_cut_back_or_resigned_combiner_log_is_caught(job, tmp_path, capsys):
    log = job / "combiner-A" / "audit.log"
    saved = {p: p.read_bytes() for p in (log, checkpoints_path(log), job / "combiner-A" / "audit_signing.key")}
    # cut back to the first round's checkpoint, with <log>.checkpoints: only the controller's copies can tell
    first_round = 4 + 1 + 1  # 4 records, the checkpoint after the first record, the round's checkpoint
    log.write_bytes(b"".join(lines(log)[:first_round]))
    checkpoints_path(log).write_bytes(b"".join(checkpoints_path(log).read_bytes().splitlines(keepends=True)[:2]))
    code, out = verify(capsys, log)
    assert code == TAMPERED and "truncated" in out
    for p, data in saved.items():
        p.write_bytes(data)
    mallory = tmp_path / "mallory.key"
    generate_signing_key(mallory)
    forge(log, set_outcome(2, "denied"), resign=mallory)
    shutil.copy(mallory, job / "combiner-A" / "audit_signing.key")
    code, out = verify(capsys, log)
    assert code == TAMPERED and out.startswith("TAMPERED") and "re-signed" in out
    moved = Path(shutil.move(job / "controller", tmp_path / "controller-copy"))
    code, out = verify(capsys, log)  # its records say it is a combiner's: its own key file cannot vouch for it
    assert code == UNVERIFIABLE and "federated combiner" in out and "pinned only by" in out
    code, out = verify(capsys, log, "--peer-dir", str(moved))
    assert code == TAMPERED and "re-signed" in out


def test_a_combiner_log_copied_away_is_found_by_its_records(job, tmp_path, capsys):
    away = tmp_path / "evidence" / "audit.log"
    away.parent.mkdir()
    shutil.copy(job / "combiner-B" / "audit.log", away)
    code, out = verify(capsys, away)
    assert code == UNVERIFIABLE and "no key is pinned" in out
    code, out = verify(capsys, away, "--peer-dir", str(job / "controller"))  # `nebula@B/1:combiner`: combiner-B
    assert code == OK and "from peer controller" in out


def test_the_controllers_own_log_has_no_witness_and_is_not_ok_alone(job, capsys):
    log = job / "controller" / "audit.log"
    code, out = verify(capsys, log)
    assert code == UNVERIFIABLE and "federated controller" in out and "fix: pass --peer-dir" in out
    code, out = verify(capsys, log, "--key", str(job / "controller" / "audit_signing.key"))
    assert code == OK and "no witness" in out
