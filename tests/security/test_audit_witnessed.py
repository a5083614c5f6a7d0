"""Audit tails no one on a switch's host can rewrite: a refusal puts a signed head at the peers within seconds, a stop
(SIGTERM) hands its closing checkpoint to the connected peers, and records after the last checkpoint a witness holds
are SUSPICIOUS, never OK: the tail rewrite that once passed (cut back to the last witnessed checkpoint, refusals
dropped, chain recomputed) is caught on real switches."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from nebula.channel import Endpoint, SwitchRefused
from security.audit import (CHECKPOINT_ACTION, PEER_CHECKPOINT_ACTION, checkpoint_of_record, checkpoints_path,
                            peer_checkpoints_path, read_checkpoints, read_records)
from security.cli import main as admin
from security.curve import write_curve_keypair
from security.provision import provision
from tests.harness.federation import start_switch, wait_audit
from tests.security.test_audit import forge

OK, SUSPICIOUS = 0, 3
WITHIN_S = 10.0  # a refusal's checkpoint reaches the peer well before the periodic one (30 s after start)


@pytest.fixture
def fed(tmp_path):
    return provision("fed", ["A", "B"], tmp_path / "fed")


def _start_both(procs, fed):
    a = start_switch(procs, Path(fed["clusters"]["A"]["switch_yaml"]))
    b = start_switch(procs, Path(fed["clusters"]["B"]["switch_yaml"]))
    deadline = time.monotonic() + 30
    while not all(any(r["action"] == PEER_CHECKPOINT_ACTION for r in s.audit()) for s in (a, b)):
        assert time.monotonic() < deadline, "the switches exchanged no audit checkpoints"
        time.sleep(0.1)
    return a, b


def _held(fed, holder: str, of: str) -> list[int]:
    """Seqs of `of`'s checkpoints that `holder` keeps (beside its log and in its chain)."""
    log = Path(fed["clusters"][holder]["switch_yaml"]).parent / "audit.log"
    seqs = [cp.seq for cp in read_checkpoints(peer_checkpoints_path(log, of))]
    seqs += [checkpoint_of_record(r).seq for r in read_records(log)
             if r["action"] == PEER_CHECKPOINT_ACTION and r["target"] == of]
    return sorted(set(seqs))


def _refuse_a_stranger(fed, tmp_path, a) -> int:
    """A worker with a key switch A does not know is refused (a security record); that record's seq."""
    src = Path(fed["clusters"]["A"]["worker_yaml"])
    data = yaml.safe_load(src.read_text())
    data["tls"] = {k: str(src.parent / v) for k, v in (data.get("tls") or {}).items()} or None
    data["curve_key"] = str(tmp_path / "stranger.key_secret")
    data["transport"] = "tcp"
    write_curve_keypair(tmp_path / "stranger.key_secret")
    (tmp_path / "stranger.yaml").write_text(yaml.safe_dump({k: v for k, v in data.items() if v is not None}))
    with pytest.raises(SwitchRefused):
        Endpoint.connect(tmp_path / "stranger.yaml", job="j", rank=0, timeout_s=15)
    return wait_audit(a, lambda r: r["action"] == "worker_rejected")["seq"]


def _verify(capsys, log: Path) -> tuple[int, str]:
    code = admin(["audit", "verify", "--log", str(log)])
    out = capsys.readouterr().out
    assert len(out.splitlines()) == 1, out
    return code, out


def rewrite_unwitnessed_tail(log: Path, witnessed: int) -> None:
    """The rewrite: cut back to the last witnessed checkpoint (seq `witnessed`), the refusals dropped, the chain
    recomputed (no key needed: the records after it were never signed for anyone outside)."""
    def cut(recs):
        head, tail = recs[:witnessed + 1], recs[witnessed + 1:]
        return head + [r for r in tail if r["action"] not in ("worker_rejected", CHECKPOINT_ACTION)]

    kept = sum(cp.seq <= witnessed for cp in read_checkpoints(checkpoints_path(log)))
    forge(log, cut, keep_checkpoint_file=kept)


def test_a_refusal_reaches_the_peer_within_seconds_and_a_stop_hands_it_the_closing_checkpoint(procs, fed, tmp_path,
                                                                                             capsys):
    a, b = _start_both(procs, fed)
    refused = _refuse_a_stranger(fed, tmp_path, a)
    deadline = time.monotonic() + WITHIN_S
    while not any(s >= refused for s in _held(fed, "B", "A")):
        assert time.monotonic() < deadline, f"B holds no checkpoint of A covering record {refused}: {_held(fed, 'B', 'A')}"
        time.sleep(0.1)
    assert a.stop() == 0  # SIGTERM
    recs = list(read_records(a.log.parent / "audit.log"))
    assert [r["action"] for r in recs[-2:]] == ["switch_stopped", CHECKPOINT_ACTION]
    assert recs[-1]["detail"]["seq"] == len(recs) - 1 in _held(fed, "B", "A")  # B holds the closing checkpoint
    code, out = _verify(capsys, a.log.parent / "audit.log")
    assert code == OK and out.startswith("OK"), out
    assert b.stop() == 0


def test_a_tail_no_peer_holds_is_suspicious_and_so_is_its_rewrite(procs, fed, tmp_path, capsys):
    a, b = _start_both(procs, fed)
    assert b.stop() == 0  # B first: A's closing checkpoint reaches no one
    _refuse_a_stranger(fed, tmp_path, a)
    assert a.stop() == 0
    log = a.log.parent / "audit.log"
    witnessed = max(_held(fed, "B", "A"))
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
