"""Attacks by a peer switch that holds a valid certificate: each is refused and audited while a legitimate
transfer through the same switch completes with nothing lost."""
from __future__ import annotations

import socket
import struct
import time
from pathlib import Path

import pytest

from nebula.channel import Endpoint, PeerUnavailable
from nebula.config import split_host_port
from nebula.wire import ChannelKey, FrameType, encode_frame
from security.ca import CertificateAuthority
from security.provision import provision
from testbed.federation import edit_yaml, start_switch, wait_audit
from testbed.attackers import RawPeer
from tests.switch.conftest import TEST_CHUNK_BYTES, legit_transfer, worker_yaml


@pytest.fixture
def three(tmp_path):
    """Federation A, B, C: A and B run switches, C's certificate is the attacker's."""
    fed = provision("fed", ["A", "B", "C"], tmp_path / "fed")
    for c in ("A", "B", "C"):
        edit_yaml(Path(fed["clusters"][c]["switch_yaml"]),
                  lambda d: d.setdefault("link", {}).update(chunk_bytes=TEST_CHUNK_BYTES))
    return fed


def _summed(switch, action: str, want: int, timeout_s: float = 20.0) -> tuple[list[dict], int]:
    """Records of `action` and the events they stand for (events not written one by one are summed up in a record
    written a period later), waiting until they reach `want`."""
    deadline = time.monotonic() + timeout_s
    while True:
        recs = [r for r in switch.audit() if r["action"] == action]
        total = sum(1 + r["detail"].get("suppressed", 0) for r in recs)
        if total >= want or time.monotonic() > deadline:
            return recs, total
        time.sleep(0.2)


def test_peer_cannot_speak_for_another_cluster(procs, three):
    """C's session carries a DATA frame claiming to come from B: refused, audited, counted; C's own frames and a
    B->A transfer still arrive."""
    a = start_switch(procs, Path(three["clusters"]["A"]["switch_yaml"]))
    start_switch(procs, Path(three["clusters"]["B"]["switch_yaml"]))
    t, got = legit_transfer(three, 20)
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
    """A allows peer C only account nebula (peers[].accounts), whose workers on A may join only job j: C's frames
    for account ops or for job secret are refused and audited, while a B->A transfer of job j completes."""
    ya = Path(three["clusters"]["A"]["switch_yaml"])
    edit_yaml(ya, lambda d: ([p.update(accounts=["nebula"]) for p in d["peers"] if p["cluster"] == "C"],
                             [w.update(jobs=["j"]) for w in d["local"]["workers"]]))
    a = start_switch(procs, ya)
    start_switch(procs, Path(three["clusters"]["B"]["switch_yaml"]))
    t, got = legit_transfer(three, 20)
    c = RawPeer(a.wan, three["clusters"]["C"]["switch_yaml"])
    try:
        c.hello()
        c.data(ChannelKey("j", "ops", "C", 0, "A", 0, "x"), b"not for you")
        refusal = c.read_until(FrameType.ERROR)
        assert refusal.meta["code"] == "account_not_reachable" and "accounts" in refusal.meta["message"]
        c.data(ChannelKey("secret", "nebula", "C", 0, "A", 0, "x"), b"nor this job")
        refusal = c.read_until(FrameType.ERROR)
        assert refusal.meta["code"] == "job_not_reachable" and "may join: j" in refusal.meta["message"]
    finally:
        c.close()
    for reason in ("account_not_reachable", "job_not_reachable"):
        rec = wait_audit(a, lambda r: r["action"] == "frame_refused" and r["detail"].get("reason") == reason)
        assert rec["target"] == "C" and rec["outcome"] == "denied"
    t.join(90)
    assert [int.from_bytes(m[:4], "big") for m in got] == list(range(20))


def test_peer_batch_whose_table_lies_is_refused_audited_and_the_session_goes_on(procs, three):
    """C relays a batch frame whose length table lies (its own switch would have refused it from its worker): A
    refuses it on the session (bad_batch), audits it, delivers none of it, and C's honest batch that follows on the
    same session arrives whole, as does a B->A transfer."""
    a = start_switch(procs, Path(three["clusters"]["A"]["switch_yaml"]))
    start_switch(procs, Path(three["clusters"]["B"]["switch_yaml"]))
    t, got = legit_transfer(three, 20)
    with Endpoint.connect(worker_yaml(three, "A"), job="victimjob", rank=0) as victim:
        rx = victim.channel("C", 0, "x")
        c = RawPeer(a.wan, three["clusters"]["C"]["switch_yaml"])
        try:
            c.hello()
            key = ChannelKey("victimjob", "nebula", "C", 0, "A", 0, "x")
            # 40,001 bytes claimed, 40,000 there: large enough to be decrypted into the victim's arena (placed) before
            # it is whole and refused
            lying = struct.pack(">4I", 40_000, 1, 0, 0) + b"a" * 40_000
            c.data(key, lying, seq=1, batch=2)
            refusal = c.read_until(FrameType.ERROR)
            assert refusal.meta["code"] == "bad_batch" and "does not add up" in refusal.meta["message"]
            c.data(key, struct.pack(">4I", 1, 2, 0, 0) + b"xyz", seq=1, batch=2)
            assert [rx.recv(timeout_s=30), rx.recv(timeout_s=30)] == [b"x", b"yz"]  # the session keeps serving
        finally:
            c.close()
    rec = wait_audit(a, lambda r: r["action"] == "frame_refused" and r["detail"].get("reason") == "bad_batch")
    assert rec["target"] == "C" and rec["detail"]["channel"]["src"] == ["C", 0]
    t.join(90)
    assert [int.from_bytes(m[:4], "big") for m in got] == list(range(20))


def test_peer_ignoring_its_credit_is_cut_with_a_reason(procs, three):
    """C sends far past the credit A granted (to a rank that never connects): its session is closed with
    credit_exceeded, audited; A's memory held for it stays within the peer budget; B->A traffic is untouched."""
    ya = Path(three["clusters"]["A"]["switch_yaml"])
    edit_yaml(ya, lambda d: d.setdefault("limits", {}).update(peer_memory_bytes=2 * 1024**2))
    a = start_switch(procs, ya)
    start_switch(procs, Path(three["clusters"]["B"]["switch_yaml"]))
    t, got = legit_transfer(three, 20)
    c = RawPeer(a.wan, three["clusters"]["C"]["switch_yaml"])
    try:
        credit = c.hello()["credit"]
        assert credit <= 2 * 1024**2 + TEST_CHUNK_BYTES
        key = ChannelKey("j", "nebula", "C", 0, "A", 7, "flood")
        with pytest.raises((ConnectionError, OSError)):
            for i in range(200):  # 40 MB against a 2 MiB credit
                c.data(key, bytes(200_000), seq=i + 1)
            c.read_until(FrameType.LINK_WELCOME)  # (never comes: the switch closes the session)
    finally:
        c.close()
    rec = wait_audit(a, lambda r: r["action"] == "frame_refused" and r["detail"].get("reason") == "credit_exceeded")
    assert rec["target"] == "C" and "granted" in rec["detail"]["detail"]
    t.join(90)
    assert [int.from_bytes(m[:4], "big") for m in got] == list(range(20))


def test_ping_and_checkpoint_floods_are_bounded(procs, three):
    """C floods CHECKPOINT frames, then PINGs without reading PONGs: the excess goes unanswered (counted, audited in
    aggregate), at most a few checkpoints are looked at, the ping flood gets C's session cut, and a B->A transfer
    completes meanwhile."""
    a = start_switch(procs, Path(three["clusters"]["A"]["switch_yaml"]))
    start_switch(procs, Path(three["clusters"]["B"]["switch_yaml"]))
    t, got = legit_transfer(three, 20)
    c = RawPeer(a.wan, three["clusters"]["C"]["switch_yaml"])
    try:
        c.hello()
        c.send(encode_frame(FrameType.CHECKPOINT, {"checkpoint": "{}"}) * 500)
        # (the connection stays open meanwhile: closing it with answers unread would reset it before A reads all)
        wait_audit(a, lambda r: r["action"] == "control_ignored" and r["detail"]["reason"] == "checkpoint_flood")
        with pytest.raises((ConnectionError, OSError)):
            ping = encode_frame(FrameType.PING, {"t": 1.0})
            for _ in range(50):
                c.send(ping * 1000)  # up to 50,000 PINGs, never reading a PONG
            c.read_until(FrameType.LINK_WELCOME, limit=100_000)  # (never comes: the session is cut)
    finally:
        c.close()
    rec = wait_audit(a, lambda r: r["action"] == "frame_refused" and r["detail"]["reason"] == "ping_flood")
    assert rec["target"] == "C"
    t.join(90)
    assert [int.from_bytes(m[:4], "big") for m in got] == list(range(20))
    looked_at = [r for r in a.audit() if r["action"] == "peer_checkpoint_rejected" and r["target"] == "C"]
    assert 1 <= len(looked_at) <= 5, len(looked_at)
    ignored, total = _summed(a, "control_ignored", 2000)
    assert len(ignored) < 100 and total >= 2000, (len(ignored), total)


def test_unidentified_connections_are_capped(procs, three):
    """200 TCP connections that never finish TLS or send LINK_HELLO: beyond limits.max_unauthenticated the oldest
    are closed, audited in aggregate, and B->A traffic goes on."""
    ya = Path(three["clusters"]["A"]["switch_yaml"])
    edit_yaml(ya, lambda d: d.setdefault("limits", {}).update(max_unauthenticated=16))
    a = start_switch(procs, ya)
    start_switch(procs, Path(three["clusters"]["B"]["switch_yaml"]))
    t, got = legit_transfer(three, 20)
    conns = []
    try:
        for _ in range(200):
            conns.append(socket.create_connection(split_host_port(a.wan), timeout=10))
        rec = wait_audit(a, lambda r: r["action"] == "peer_rejected"
                         and r["detail"]["reason"] == "too_many_unauthenticated")
        assert rec["detail"]["limit"] == 16
        t.join(90)
        assert [int.from_bytes(m[:4], "big") for m in got] == list(range(20))
    finally:
        for s in conns:
            s.close()
    refused, total = _summed(a, "peer_rejected", 100)
    assert len(refused) < 50 and total >= 100, (len(refused), total)


def test_live_session_is_cut_when_the_peer_certificate_expires(procs, three):
    """C connects with a certificate valid for ten more seconds (room for a loaded machine to finish the
    handshake): once it expires, A closes the live session and audits it (revocation already did so; expiry now
    does too); a B->A transfer completes meanwhile."""
    a = start_switch(procs, Path(three["clusters"]["A"]["switch_yaml"]))
    start_switch(procs, Path(three["clusters"]["B"]["switch_yaml"]))
    ca = CertificateAuthority.open(three["ca"])
    short = ca.issue("short-c", "switch", "C", days=10 / 86400, out_dir=Path(three["ca"]).parent / "short")
    c = RawPeer(a.wan, three["clusters"]["C"]["switch_yaml"], cert=short.cert_path, key=short.key_path, timeout_s=30)
    try:
        c.hello()
        t, got = legit_transfer(three, 20)
        with pytest.raises((ConnectionError, OSError)):
            c.read_until(FrameType.LINK_WELCOME, limit=10_000)  # PONGs... until A cuts the session
    finally:
        c.close()
    rec = wait_audit(a, lambda r: r["action"] == "peer_rejected" and r["detail"].get("reason") == "expired"
                     and r["detail"].get("live"))
    assert rec["target"] == "C"
    t.join(90)
    assert [int.from_bytes(m[:4], "big") for m in got] == list(range(20))
