"""Audit tails no one on a switch's host can rewrite: a refusal puts a signed head at the peers within seconds, a stop
(SIGTERM) hands its closing checkpoint to the connected peers, and records after the last checkpoint a witness holds
are SUSPICIOUS, never OK: the tail rewrite that once passed (cut back to the last witnessed checkpoint, refusals
dropped, chain recomputed) is caught on real switches."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from security.audit import CHECKPOINT_ACTION, read_records
from security.cli import main as admin
from security.provision import provision
from testbed.audit import OK, SUSPICIOUS, held, refuse_a_stranger, rewrite_unwitnessed_tail, start_both

WITHIN_S = 10.0  # a refusal's checkpoint reaches the peer well before the periodic one (30 s after start)


@pytest.fixture
def fed(tmp_path):
    return provision("fed", ["A", "B"], tmp_path / "fed")


def _verify(capsys, log: Path) -> tuple[int, str]:
    code = admin(["audit", "verify", "--log", str(log)])
    out = capsys.readouterr().out
    assert len(out.splitlines()) == 1, out
    return code, out


def test_a_refusal_reaches_the_peer_within_seconds_and_a_stop_hands_it_the_closing_checkpoint(procs, fed, tmp_path,
                                                                                             capsys):
    a, b = start_both(procs, fed)
    refused = refuse_a_stranger(fed, tmp_path, a)
    deadline = time.monotonic() + WITHIN_S
    while not any(s >= refused for s in held(fed, "B", "A")):
        assert time.monotonic() < deadline, f"B holds no checkpoint of A covering record {refused}: {held(fed, 'B', 'A')}"
        time.sleep(0.1)
    assert a.stop() == 0  # SIGTERM
    recs = list(read_records(a.log.parent / "audit.log"))
    assert [r["action"] for r in recs[-2:]] == ["switch_stopped", CHECKPOINT_ACTION]
    assert recs[-1]["detail"]["seq"] == len(recs) - 1 in held(fed, "B", "A")  # B holds the closing checkpoint
    code, out = _verify(capsys, a.log.parent / "audit.log")
    assert code == OK and out.startswith("OK"), out
    assert b.stop() == 0


def test_a_tail_no_peer_holds_is_suspicious_and_so_is_its_rewrite(procs, fed, tmp_path, capsys):
    a, b = start_both(procs, fed)
    assert b.stop() == 0  # B first: A's closing checkpoint reaches no one
    refuse_a_stranger(fed, tmp_path, a)
    assert a.stop() == 0
    log = a.log.parent / "audit.log"
    witnessed = max(held(fed, "B", "A"))
    code, out = _verify(capsys, log)  # the honest log: its end is signed, but held by no peer
    assert code == SUSPICIOUS and out.startswith("SUSPICIOUS"), out
    assert f"after seq {witnessed}, the last checkpoint a witness holds, are unwitnessed" in out
    assert "clean stop, but no witness holds its closing checkpoint" in out and "start it again while a peer" in out

    rewrite_unwitnessed_tail(log, witnessed)
    assert not [r for r in read_records(log) if r["action"] == "worker_rejected"]
    code, out = _verify(capsys, log)
    assert code == SUSPICIOUS and out.startswith("SUSPICIOUS"), out  # (it was OK: 1000 unsigned records passed)
    assert f"first bad record {witnessed + 1}" in out and "does not end with a clean stop" in out
    assert json.loads(log.read_bytes().splitlines()[-1])["action"] != CHECKPOINT_ACTION
