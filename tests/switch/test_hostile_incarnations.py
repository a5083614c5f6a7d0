"""Acknowledgements and incarnations a peer or a worker cannot forge, and streams that survive a restart of either
end, through real switch servers: an ACK is bounded by what was sent, carries no field beyond the protocol's and
obeys route grants; an incarnation is the one the switch gave; a restarted receiver is re-learnt; what an ended
sender left behind reaches no later receiver; a worker whose clock is behind is heard."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

from nebula.channel import Endpoint
from nebula.config.switch import load_switch_config
from nebula.wire import ChannelKey, FrameType, decode_frame, encode_frame
from switch_server.answers import ANSWER_BURST
from switch_server.status import status_path
from tests.conftest import REPO
from testbed.attackers import RawPeer
from testbed.federation import start_switch, wait_audit
from tests.switch.conftest import legit_transfer, worker_yaml
from tests.switch.test_hostile_peers import three  # noqa: F401  (fixture)
from tests.switch.test_relay import _next_error, _raw_worker, raw_hello
from tests.switch.test_route_grants import granted  # noqa: F401  (fixture)

TOP = 2**64 - 1


def test_ack_beyond_what_was_sent_is_refused_and_the_sender_goes_on(procs, three):  # noqa: F811
    """C acknowledges message 2^64-1 of a channel on which A's worker sent 3: A refuses it (audited, told to C), and
    the worker, not frozen, goes on serving its other channels."""
    a = start_switch(procs, Path(three["clusters"]["A"]["switch_yaml"]))
    start_switch(procs, Path(three["clusters"]["B"]["switch_yaml"]))
    with Endpoint.connect(worker_yaml(three, "A"), job="j", rank=0) as victim, \
            Endpoint.connect(worker_yaml(three, "B"), job="j", rank=0) as eb:
        to_c = victim.channel("C", 0, "x")
        for i in range(3):  # (C runs no switch: they wait in A's link)
            to_c.send(b"m%d" % i).result(timeout=30)
        c = RawPeer(a.wan, three["clusters"]["C"]["switch_yaml"])
        try:
            c.hello()
            c.ack(to_c.tx_key, TOP, 0, inc=(1 << 32) | 1, to=victim._io.inc)
            refusal = c.read_until(FrameType.ERROR)
            assert refusal.meta["code"] == "ack_beyond_sent" and "sent only 3" in refusal.meta["message"]
        finally:
            c.close()
        victim.channel("B", 0, "y").send(b"still here")
        assert eb.channel("A", 0, "y").recv(timeout_s=30) == b"still here"
        assert victim._io.tx[to_c.tx_key.id].acked == 0  # nothing was taken as acknowledged
        victim.close(flush_s=0)  # (C runs no switch: its messages are never acknowledged, so no flush wait)
    rec = wait_audit(a, lambda r: r["action"] == "frame_refused" and r["detail"].get("reason") == "ack_beyond_sent")
    assert rec["target"] == "C" and rec["detail"]["type"] == "ACK"


def test_acks_carry_nothing_beyond_the_protocol_and_obey_route_grants(granted):  # noqa: F811
    """Account ops holds no grant for cluster B: an ACK with a field of its own is refused as malformed, and a
    well-formed ACK to B is refused by the route grants (audited), as its DATA would be."""
    fed, a, _b, _home, ops_a, _ops_b = granted
    s = _raw_worker(fed, "A", ops_a)
    try:
        inc = raw_hello(s, job="j", rank=0, account="ops", name="opsw")
        key = ChannelKey("j", "ops", "B", 0, "A", 0, "x")  # B/0 -> A/0: A/0 acknowledges towards B
        smuggled = encode_frame(FrameType.ACK, {**key.to_meta(), "consumed": 0, "inc": inc, "x": "y" * 4000},
                                channel_id=key.id)
        s.send(smuggled)
        err = _next_error(s)
        assert err["code"] == "bad_meta" and "'x'" in err["message"] and "does not define" in err["message"]
        s.send(encode_frame(FrameType.ACK, {**key.to_meta(), "consumed": 0, "inc": inc}, channel_id=key.id))
        err = _next_error(s)
        assert err["code"] == "not_authorized" and "cluster:B" in err["message"]
    finally:
        s.close(0)
    rec = wait_audit(a, lambda r: r["action"] == "route_refused" and r["target"] == "ops")
    assert rec["detail"]["cluster"] == "B"


def test_forged_incarnations_are_refused_and_the_real_sender_gets_through(procs, three):  # noqa: F811
    """A peer naming an incarnation its switch cannot have given, and a worker naming one other than its own,
    are refused (audited); the receiver's stream is not taken over, so the real senders' messages arrive."""
    a = start_switch(procs, Path(three["clusters"]["A"]["switch_yaml"]))
    b = start_switch(procs, Path(three["clusters"]["B"]["switch_yaml"]))
    with Endpoint.connect(worker_yaml(three, "A"), job="j", rank=0) as victim:
        from_c, from_b = victim.channel("C", 0, "x"), victim.channel("B", 0, "y")
        c = RawPeer(a.wan, three["clusters"]["C"]["switch_yaml"])
        try:
            c.hello(epoch=1)
            key = ChannelKey("j", "nebula", "C", 0, "A", 0, "x")
            c.data(key, b"poison", seq=1, inc=2**63 - 1)
            refusal = c.read_until(FrameType.ERROR)
            assert refusal.meta["code"] == "bad_incarnation" and "boot 1" in refusal.meta["message"]
            c.data(key, b"from C", seq=1, inc=(1 << 32) | 1)
            assert from_c.recv(timeout_s=30) == b"from C"
        finally:
            c.close()
        # a process holding B's rank 0 for a moment names an incarnation that is not its own
        s = _raw_worker(three, "B")
        try:
            inc = raw_hello(s, job="j", rank=0)
            key = ChannelKey("j", "nebula", "B", 0, "A", 0, "y")
            s.send_multipart([encode_frame(FrameType.DATA, {**key.to_meta(), "inc": 2**63 - 1}, b"poison",
                                           channel_id=key.id, seq=1), b"poison"])
            err = _next_error(s)
            assert err["code"] == "bad_incarnation" and str(inc) in err["message"]
            s.send(encode_frame(FrameType.BYE))
        finally:
            s.close(0)
        with Endpoint.connect(worker_yaml(three, "B"), job="j", rank=0) as real:
            real.channel("A", 0, "y").send(b"real")
            assert from_b.recv(timeout_s=30) == b"real"
    rec = wait_audit(a, lambda r: r["action"] == "frame_refused" and r["detail"].get("reason") == "bad_incarnation")
    assert rec["target"] == "C"
    rec = wait_audit(b, lambda r: r["action"] == "frame_refused" and r["detail"].get("reason") == "bad_incarnation")
    assert rec["detail"]["account"] == "nebula"


def test_a_restarted_receiver_is_relearnt_and_gets_what_its_predecessor_left(two_switches):
    """B/0 consumes one of three messages and stops; A/0 sends two more; a new start of B/0 gets, in order, the
    four its predecessor did not consume (the sender learns of it from its first acknowledgement)."""
    fed = two_switches[0]
    msgs = [b"m%d" % i for i in range(5)]
    with Endpoint.connect(worker_yaml(fed, "A"), job="j", rank=0) as ea:
        tx = ea.channel("B", 0, "x")
        with Endpoint.connect(worker_yaml(fed, "B"), job="j", rank=0) as r1:
            for m in msgs[:3]:
                tx.send(m)
            assert r1.channel("A", 0, "x").recv(timeout_s=30) == msgs[0]
            assert ea.flush(30)  # (all three acknowledged by the first start)
        last = [tx.send(m) for m in msgs[3:]]
        with Endpoint.connect(worker_yaml(fed, "B"), job="j", rank=0) as r2:
            rx = r2.channel("A", 0, "x")
            assert [rx.recv(timeout_s=60) for _ in range(4)] == msgs[1:]
            for f in last:
                f.result(timeout=30)


def test_what_an_ended_sender_left_for_a_rank_not_connected_reaches_no_later_start(two_switches):
    """A run's sender sends `stop` to a rank not connected and ends; the rank's next start gets the next run's
    messages, not that `stop`."""
    fed, _a, b = two_switches
    with Endpoint.connect(worker_yaml(fed, "A"), job="run", rank=0) as s1:
        s1.channel("B", 0, "ctl").send(b"stop")
        time.sleep(0.5)  # (on its way to B, or held there: either way it must expire with its sender)
        s1.close(flush_s=0)
    # B drops it once it knows that start ended (ENDED from A); a rank that connects before that news arrives, a
    # moment after the end, could still get it: the test starts the next run after it
    st = json.loads(status_path(load_switch_config(b.config)).read_text())
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        metrics = urllib.request.urlopen(f"http://{st['metrics']}/metrics", timeout=10).read().decode()
        if re.search(r'nebula_switch_refused_frames_total\{reason="sender_ended"\} [1-9]', metrics):
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"switch B did not drop the ended start's message:\n{metrics[-2000:]}")
    with Endpoint.connect(worker_yaml(fed, "B"), job="run", rank=0) as r, \
            Endpoint.connect(worker_yaml(fed, "A"), job="run", rank=0) as s2:
        s2.channel("B", 0, "ctl").send(b"fresh")
        assert r.channel("A", 0, "ctl").recv(timeout_s=30) == b"fresh"


def test_a_bye_flood_is_answered_sparingly_and_audited(two_switches):
    """A connection sending 5,000 BYEs gets at most a burst of answers, the flood is audited, and another worker's
    transfer through the same switch completes."""
    fed, a, _b = two_switches
    t, got = legit_transfer(fed, 20)
    s = _raw_worker(fed, "A")
    answers = 0
    try:
        bye = encode_frame(FrameType.BYE)
        for _ in range(5000):
            s.send(bye)
        s.rcvtimeo = 2000
        while True:
            try:
                parts = s.recv_multipart()
            except Exception:  # (zmq.Again: nothing more within 2 s)
                break
            answers += decode_frame(parts[0], parts[1] if len(parts) > 1 else b"").type == FrameType.BYE
    finally:
        s.close(0)
    assert 0 < answers < 5000 and answers <= ANSWER_BURST * 2
    rec = wait_audit(a, lambda r: r["action"] == "frame_refused" and r["detail"].get("reason") == "answers_limited")
    assert rec["detail"]["frames"] == "bye"
    t.join(90)
    assert [int.from_bytes(m[:4], "big") for m in got] == list(range(20))


_BEHIND = textwrap.dedent("""
    import sys, time
    _t, _tn = time.time, time.time_ns
    time.time = lambda: _t() - 86400.0  # this host's clock is a day behind
    time.time_ns = lambda: _tn() - 86400 * 10**9
    from nebula.channel import Endpoint
    with Endpoint.connect(sys.argv[1], job="j", rank=0) as ep:
        ep.channel("B", 0, "x").send(b"two from a slow clock").result(30)
        assert ep.flush(30)
""")


def test_a_restart_on_a_host_whose_clock_is_behind_is_heard(two_switches):
    """A/0 sends, ends, and starts again on a host whose clock is a day behind: B/0 takes the new start's message
    (incarnations come from the switch, not from clocks)."""
    fed = two_switches[0]
    with Endpoint.connect(worker_yaml(fed, "B"), job="j", rank=0) as r:
        rx = r.channel("A", 0, "x")
        with Endpoint.connect(worker_yaml(fed, "A"), job="j", rank=0) as s1:
            s1.channel("B", 0, "x").send(b"one")
            assert rx.recv(timeout_s=30) == b"one"
        out = subprocess.run([sys.executable, "-c", _BEHIND, worker_yaml(fed, "A")], cwd=REPO, capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        assert rx.recv(timeout_s=30) == b"two from a slow clock"


def test_acknowledgements_are_bounded_by_what_the_sender_sent():
    """The sender's own count bounds an ACK: one claiming 2^64-1 messages is refused at once (no loop over the
    claimed range: this test would not end) and changes nothing."""
    from concurrent.futures import Future

    from nebula.channel.delivery import OutMessage, Sender
    from nebula.wire import Lane

    key = ChannelKey("j", "a", "A", 0, "B", 0, "x")
    tx = Sender(key, 1 << 20, inc=5)
    msgs = [OutMessage(memoryview(b"m"), None, Lane.ACTIVATION, Future()) for _ in range(3)]
    for m in msgs:
        tx.submit(m)
    assert "only 3 were sent" in tx.ack_refusal(TOP, 0)
    assert tx.on_ack(TOP, 0, 0.0) == [] and tx.acked == 0 and len(tx.unacked) == 3
    assert tx.ack_refusal(3, 4) is not None and tx.ack_refusal(3, 3) is None
