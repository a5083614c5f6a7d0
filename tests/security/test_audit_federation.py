"""Audit evidence across a real federation: switches cross-sign their heads, and `audit verify` finds and uses
the peer's copies and pinned key by default, so attacks on one switch's files alone are caught."""
from __future__ import annotations

import shutil
import signal
import time
from pathlib import Path

from security.audit import PEER_CHECKPOINT_ACTION, checkpoints_path, generate_signing_key, read_records
from security.cli import main as admin
from security.provision import provision
from tests.security.test_audit import forge, lines, set_outcome
from tests.switch.conftest import start_switch


def _stop(switch) -> None:
    switch.proc.send_signal(signal.SIGTERM)
    assert switch.proc.wait(20) == 0


def _verify(capsys, log: Path) -> tuple[int, str]:
    code = admin(["audit", "verify", "--log", str(log)])
    return code, capsys.readouterr().out


def test_attacks_on_one_switchs_audit_files_are_caught_by_default(procs, tmp_path, capsys):
    fed = provision("fed", ["A", "B"], tmp_path / "fed")
    a = start_switch(procs, Path(fed["clusters"]["A"]["switch_yaml"]))
    b = start_switch(procs, Path(fed["clusters"]["B"]["switch_yaml"]))
    log_a, log_b = a.config.parent / "audit.log", b.config.parent / "audit.log"
    deadline = time.monotonic() + 30
    while not all(any(r["action"] == PEER_CHECKPOINT_ACTION for r in s.audit()) for s in (a, b)):
        assert time.monotonic() < deadline, "the switches exchanged no audit checkpoints"
        time.sleep(0.1)
    _stop(a)
    _stop(b)
    held = [r for r in read_records(log_b) if r["action"] == PEER_CHECKPOINT_ACTION and r["target"] == "A"]
    assert held and held[-1]["detail"]["checkpoint"]["seq"] > 2  # B's own log holds A's signed head

    code, out = _verify(capsys, log_a)
    assert code == 0 and out.startswith("OK"), out
    assert "switch.yaml audit.signing_key" in out and "from peer B" in out
    saved = {p: p.read_bytes() for p in (log_a, checkpoints_path(log_a), a.config.parent / "audit_signing.key")}

    def restore() -> None:
        for p, data in saved.items():
            p.write_bytes(data)

    # 1. cut back to the first checkpoint, the log and <log>.checkpoints consistently: B's copy says more existed
    log_a.write_bytes(b"".join(lines(log_a)[:2]))
    checkpoints_path(log_a).write_bytes(checkpoints_path(log_a).read_bytes().splitlines(keepends=True)[0])
    code, out = _verify(capsys, log_a)
    assert code == 1 and out.startswith("TAMPERED") and "truncated" in out
    restore()

    # 2. rewrite and re-sign everything with a new key put in place of audit_signing.key: B pinned the old one
    mallory = tmp_path / "mallory.key"
    generate_signing_key(mallory)
    forge(log_a, set_outcome(1, "denied"), resign=mallory)
    shutil.copy(mallory, a.config.parent / "audit_signing.key")
    code, out = _verify(capsys, log_a)
    assert code == 1 and out.startswith("TAMPERED") and "different key than the one pinned" in out
    restore()

    # 3. rewrite with recomputed hashes and delete <log>.checkpoints
    forge(log_a, set_outcome(1, "denied"))
    code, out = _verify(capsys, log_a)
    assert code == 1 and out.startswith("TAMPERED") and "rewritten" in out
    restore()

    # 4. empty the log and delete its checkpoints: B's copy covers records that are gone; without B's copy (peer
    # unreachable), the switch's boot epoch still says it has run, so an empty log is no fresh one
    log_a.write_bytes(b"")
    checkpoints_path(log_a).unlink()
    code, out = _verify(capsys, log_a)
    assert code == 1 and out.startswith("TAMPERED") and "were deleted" in out
    shutil.move(b.config.parent, tmp_path / "B-elsewhere")
    code, out = _verify(capsys, log_a)
    assert code == 1 and out.startswith("SUSPICIOUS") and "log is empty although switch A has started" in out
    # B's directory copied from its host and named explicitly gives its witnesses back
    code = admin(["audit", "verify", "--log", str(log_a), "--peer-dir", str(tmp_path / "B-elsewhere")])
    out = capsys.readouterr().out
    assert code == 1 and out.startswith("TAMPERED") and "were deleted" in out and "from peer B" in out
