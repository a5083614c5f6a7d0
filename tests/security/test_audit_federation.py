"""Audit evidence across a real federation: switches cross-sign their heads, and `audit verify` finds and uses the
peers' copies and pinned keys by default, whatever the files beside the attacked log say, so attacks on one
switch's files alone are caught; a log nothing outside can vouch for is UNVERIFIABLE, never OK."""
from __future__ import annotations

import shutil
import signal
import time
from pathlib import Path

import pytest
import yaml

from security.audit import PEER_CHECKPOINT_ACTION, checkpoints_path, generate_signing_key, read_records
from security.cli import main as admin
from security.provision import provision
from tests.conftest import Procs
from testbed.audit import forge, lines, set_outcome
from testbed.federation import start_switch

OK, TAMPERED, USAGE, SUSPICIOUS, UNVERIFIABLE = 0, 1, 2, 3, 4


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """A federation A, B whose switches ran until each recorded the other's signed head, then stopped."""
    root = tmp_path_factory.mktemp("pristine")
    fed = provision("fed", ["A", "B"], root / "fed")
    procs = Procs()
    try:
        a = start_switch(procs, Path(fed["clusters"]["A"]["switch_yaml"]))
        b = start_switch(procs, Path(fed["clusters"]["B"]["switch_yaml"]))
        deadline = time.monotonic() + 30
        while not all(any(r["action"] == PEER_CHECKPOINT_ACTION for r in s.audit()) for s in (a, b)):
            assert time.monotonic() < deadline, "the switches exchanged no audit checkpoints"
            time.sleep(0.1)
        for s in (a, b):
            s.proc.send_signal(signal.SIGTERM)
            assert s.proc.wait(20) == 0
    finally:
        procs.reap()
    return root / "fed"


@pytest.fixture
def fed(pristine, tmp_path) -> Path:
    """A copy of the pristine federation, for one test to attack."""
    return Path(shutil.copytree(pristine, tmp_path / "fed", symlinks=True))


def verify(capsys, log: Path, *extra: str) -> tuple[int, str]:
    code = admin(["audit", "verify", "--log", str(log), *extra])
    out = capsys.readouterr().out
    assert len(out.splitlines()) == 1, out  # one line, whatever the verdict
    return code, out


def resign(fed: Path, tmp_path: Path) -> Path:
    """What an attacker with A's files does: rewrite A's log, re-sign it with a new key put in place of A's."""
    mallory = tmp_path / "mallory.key"
    generate_signing_key(mallory)
    log = fed / "A" / "audit.log"
    forge(log, set_outcome(1, "denied"), resign=mallory)
    shutil.copy(mallory, fed / "A" / "audit_signing.key")
    return log


def empty(fed: Path) -> Path:
    log = fed / "A" / "audit.log"
    log.write_bytes(b"")
    checkpoints_path(log).unlink()
    return log


def test_an_honest_log_is_ok_pinned_and_witnessed_by_its_peer(fed, capsys):
    held = [r for r in read_records(fed / "B" / "audit.log")
            if r["action"] == PEER_CHECKPOINT_ACTION and r["target"] == "A"]
    assert held and held[-1]["detail"]["checkpoint"]["seq"] > 2  # B's own log holds A's signed head
    code, out = verify(capsys, fed / "A" / "audit.log")
    assert code == OK and out.startswith("OK"), out
    assert "key pinned from the key peer B pinned for A" in out and "from peer B" in out


def test_cut_back_rewritten_resigned_and_emptied_logs_are_caught(fed, tmp_path, capsys):
    log = fed / "A" / "audit.log"
    saved = {p: p.read_bytes() for p in (log, checkpoints_path(log), fed / "A" / "audit_signing.key")}

    def restore() -> None:
        for p, data in saved.items():
            p.write_bytes(data)

    # cut back to the first checkpoint, the log and <log>.checkpoints consistently: B's copy says more existed
    log.write_bytes(b"".join(lines(log)[:2]))
    checkpoints_path(log).write_bytes(checkpoints_path(log).read_bytes().splitlines(keepends=True)[0])
    code, out = verify(capsys, log)
    assert code == TAMPERED and out.startswith("TAMPERED") and "truncated" in out
    restore()
    resign(fed, tmp_path)  # B pinned the old key
    code, out = verify(capsys, log)
    assert code == TAMPERED and out.startswith("TAMPERED") and "different key than the one pinned" in out
    restore()
    forge(log, set_outcome(1, "denied"))  # rewritten with recomputed hashes, <log>.checkpoints deleted
    code, out = verify(capsys, log)
    assert code == TAMPERED and out.startswith("TAMPERED") and "rewritten" in out
    restore()
    empty(fed)  # B's copy covers records that are gone
    code, out = verify(capsys, log)
    assert code == TAMPERED and out.startswith("TAMPERED") and "were deleted" in out


def test_deleting_switch_yaml_hides_no_peer(fed, tmp_path, capsys):
    log = resign(fed, tmp_path)
    (fed / "A" / "switch.yaml").unlink()
    code, out = verify(capsys, log)  # B beside it still pins A's real key
    assert code == TAMPERED and out.startswith("TAMPERED") and "the key peer B pinned for A" in out
    empty(fed)
    code, out = verify(capsys, log)
    assert code == TAMPERED and "were deleted" in out and "from peer B" in out


def test_peers_emptied_in_switch_yaml_hide_no_peer(fed, tmp_path, capsys):
    log = resign(fed, tmp_path)
    doc = yaml.safe_load((fed / "A" / "switch.yaml").read_text())
    (fed / "A" / "switch.yaml").write_text(yaml.safe_dump(dict(doc, peers=[])))
    code, out = verify(capsys, log)
    assert code == TAMPERED and out.startswith("TAMPERED") and "re-signed" in out


def test_peer_dir_is_used_without_switch_yaml(fed, tmp_path, capsys):
    log = resign(fed, tmp_path)
    (fed / "A" / "switch.yaml").unlink()
    elsewhere = Path(shutil.move(fed / "B", tmp_path / "from-B-host"))  # B's directory, copied from its host
    code, out = verify(capsys, log)  # nothing beside A vouches for the key now: never OK
    assert code == UNVERIFIABLE and out.startswith("UNVERIFIABLE") and "pinned only by" in out
    assert "fix: pass --peer-dir with the directory of peer B" in out  # named by A's records (switch_started)
    code, out = verify(capsys, log, "--peer-dir", str(elsewhere))
    assert code == TAMPERED and out.startswith("TAMPERED") and "the key peer B pinned for A" in out
    code, out = verify(capsys, log, "--peer-dir", str(tmp_path))  # a directory of peers' copies works too
    assert code == TAMPERED
    empty(fed)
    code, out = verify(capsys, log, "--peer-dir", str(elsewhere))
    assert code == TAMPERED and "were deleted" in out and "from peer B" in out
    code, out = verify(capsys, log)  # the switch's boot epoch still says it ran
    assert code == SUSPICIOUS and out.startswith("SUSPICIOUS") and "state/epoch says its switch has started" in out
    shutil.rmtree(fed / "A" / "state")
    code, out = verify(capsys, log)  # emptied with no witness and a pinned key: not OK
    assert code == UNVERIFIABLE and out.startswith("UNVERIFIABLE") and "an empty log is never OK" in out


def test_a_log_away_from_its_switch_yaml_is_unverifiable_until_a_peer_vouches_for_it(fed, tmp_path, capsys):
    away = tmp_path / "copy" / "audit.log"
    away.parent.mkdir()
    shutil.copy(fed / "A" / "audit.log", away)
    code, out = verify(capsys, away)
    assert code == UNVERIFIABLE and out.startswith("UNVERIFIABLE") and "no key is pinned" in out
    code, out = verify(capsys, away, "--peer-dir", str(fed / "B"))  # its records say it is switch A's
    assert code == OK and "the key peer B pinned for A" in out
    code, out = verify(capsys, away, "--key", str(fed / "A" / "audit_signing.key"))
    assert code == OK and "no witness" in out


def test_usage_errors_have_their_own_exit_code(fed, tmp_path, capsys):
    log = fed / "A" / "audit.log"
    for argv, why in ((["--log", str(tmp_path / "nothing.log")], "does not exist"),
                      (["--log", str(log), "--peer-dir", str(tmp_path / "nowhere")], "--peer-dir"),
                      (["--log", str(log), "--peer-dir", str(tmp_path)], "holds no audit.log"),
                      (["--log", str(log), "--key", str(tmp_path / "nokey.pem")], "--key"),
                      (["--log", str(log), "--witness", str(tmp_path / "nothing")], "--witness")):
        code = admin(["audit", "verify", *argv])
        out, err = capsys.readouterr()
        assert code == USAGE and out == "" and len(err.splitlines()) == 1 and why in err, err
