"""Attacks by a peer switch that holds a valid certificate: each is refused and audited while a legitimate
transfer through the same switch completes with nothing lost."""
from __future__ import annotations

import threading
from pathlib import Path

import pytest

from nebula.channel import Endpoint, PeerUnavailable
from nebula.wire import ChannelKey, FrameType
from security.provision import provision
from tests.switch.attackers import RawPeer
from tests.switch.conftest import TEST_CHUNK_BYTES, edit_yaml, start_switch, wait_audit, worker_yaml


@pytest.fixture
def three(tmp_path):
    """Federation A, B, C: A and B run switches, C's certificate is the attacker's."""
    fed = provision("fed", ["A", "B", "C"], tmp_path / "fed")
    for c in ("A", "B", "C"):
        edit_yaml(Path(fed["clusters"][c]["switch_yaml"]),
                  lambda d: d.setdefault("link", {}).update(chunk_bytes=TEST_CHUNK_BYTES))
    return fed


def _legit_transfer(fed, n: int, job: str = "j") -> tuple[threading.Thread, list]:
    """B's worker sends `n` messages to A's; the list gets what A received (checked by the caller)."""
    got: list[bytes] = []

    def run() -> None:
        with Endpoint.connect(worker_yaml(fed, "A"), job=job, rank=0) as ea, \
                Endpoint.connect(worker_yaml(fed, "B"), job=job, rank=0) as eb:
            tx, rx = eb.channel("A", 0, "legit"), ea.channel("B", 0, "legit")
            for i in range(n):
                tx.send(i.to_bytes(4, "big") * 1000)
            for _ in range(n):
                got.append(rx.recv(timeout_s=60))
    t = threading.Thread(target=run)
    t.start()
    return t, got


def test_peer_cannot_speak_for_another_cluster(procs, three):
    """C's session carries a DATA frame claiming to come from B: refused, audited, counted; C's own frames and a
    B->A transfer still arrive."""
    a = start_switch(procs, Path(three["clusters"]["A"]["switch_yaml"]))
    start_switch(procs, Path(three["clusters"]["B"]["switch_yaml"]))
    t, got = _legit_transfer(three, 20)
    with Endpoint.connect(worker_yaml(three, "A"), job="victimjob", rank=0) as victim:
        spoofed_rx, own_rx = victim.channel("B", 0, "x"), victim.channel("C", 0, "x")
        c = RawPeer(a.wan, three["clusters"]["C"]["switch_yaml"])
        try:
            c.hello()
            forged = ChannelKey("victimjob", "nebula", "B", 0, "A", 0, "x")
            c.data(forged, b"forged by C")
            refusal = c.read_until(FrameType.ERROR)
            assert refusal.meta["code"] == "wrong_source" and "proves cluster 'C'" in refusal.meta["message"]
            c.data(ChannelKey("victimjob", "nebula", "C", 0, "A", 0, "x"), b"from C itself")
            assert own_rx.recv(timeout_s=30) == b"from C itself"  # the session keeps serving
            with pytest.raises((TimeoutError, PeerUnavailable)):  # (B's link may still be coming up)
                spoofed_rx.recv(timeout_s=1.0)
        finally:
            c.close()
    rec = wait_audit(a, lambda r: r["action"] == "frame_refused" and r["detail"].get("reason") == "wrong_source")
    assert rec["target"] == "C" and rec["detail"]["channel"]["src"] == ["B", 0]
    t.join(90)
    assert [int.from_bytes(m[:4], "big") for m in got] == list(range(20))


def test_peer_may_address_only_accounts_and_jobs_it_may_reach(procs, three):
    """A allows peer C no account but 'ops' (peers[].accounts); frames of C for account nebula are refused."""
    ya = Path(three["clusters"]["A"]["switch_yaml"])
    edit_yaml(ya, lambda d: [p.update(accounts=["ops"]) for p in d["peers"] if p["cluster"] == "C"])
    a = start_switch(procs, ya)
    c = RawPeer(a.wan, three["clusters"]["C"]["switch_yaml"])
    try:
        c.hello()
        c.data(ChannelKey("j", "nebula", "C", 0, "A", 0, "x"), b"not for you")
        refusal = c.read_until(FrameType.ERROR)
        assert refusal.meta["code"] == "account_not_reachable" and "accounts" in refusal.meta["message"]
    finally:
        c.close()
    wait_audit(a, lambda r: r["action"] == "frame_refused" and r["detail"].get("reason") == "account_not_reachable")
