"""Streams that survive any restart order, where the restarted process's host clock is a day behind: the receiver
restarted alone, the sender restarted alone (killed -9 mid-stream), and both, through real switch servers.
Incarnations come from the switch (epoch << 32 | counter), so a start on a slow clock is never taken for an older
one. (With agreeing clocks: receiver alone, tests/switch/test_hostile_incarnations.py; both,
tests/switch/test_restarted_ranks.py; sender alone with its clock behind after a clean end, also
test_hostile_incarnations.py.)"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

import pytest

from nebula.channel import Endpoint
from tests.conftest import REPO
from testbed.federation import start_switches
from testbed.procs import Procs

_ROLE = textwrap.dedent("""
    import contextlib, json, sys, time
    worker, role, behind, payload, job = sys.argv[1], sys.argv[2], float(sys.argv[3]), json.loads(sys.argv[4]), sys.argv[5]
    if behind:  # this host's clock is behind the others'
        _t, _tn = time.time, time.time_ns
        time.time = lambda: _t() - behind
        time.time_ns = lambda: _tn() - int(behind * 1e9)
    from nebula.channel import Endpoint
    with Endpoint.connect(worker, job=job, rank=0) as ep:
        if role == "send":  # payload: the messages; with "hold", stay up after sending (to be killed)
            tx = ep.channel("B", 0, "x")
            for m in payload["msgs"]:
                tx.send(m.encode())
            assert ep.flush(60)
            print("sent", flush=True)
            if payload.get("hold"):
                time.sleep(600)
        else:  # payload: how many to receive; then prove nothing more comes
            rx = ep.channel("A", 0, "x")
            got = [rx.recv(timeout_s=60).decode() for _ in range(payload["count"])]
            with contextlib.suppress(TimeoutError):  # one more message would show in `got`, which the test compares
                got.append(rx.recv(timeout_s=1.5).decode())
            print(json.dumps(got), flush=True)
""")
DAY = 86400.0


def _role(worker, job: str, role: str, payload: dict, behind: float = DAY, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _ROLE, str(worker), role, str(behind), json.dumps(payload), job],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def _done(p: subprocess.Popen) -> str:
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 0, out[-3000:]
    return out.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def workers(tmp_path_factory):
    """Switches A and B, shared by the tests of this module (each test runs a job of its own)."""
    procs = Procs()
    try:
        yield start_switches(procs, tmp_path_factory.mktemp("fed"), ["A", "B"])
    finally:
        procs.reap()


def test_a_receiver_restarted_alone_on_a_host_whose_clock_is_behind_gets_the_rest_of_its_stream(workers):
    job = "receiver-alone"
    msgs = [f"m{i}" for i in range(6)]
    with Endpoint.connect(workers["A"], job=job, rank=0) as ea:
        tx = ea.channel("B", 0, "x")
        with Endpoint.connect(workers["B"], job=job, rank=0) as r1:
            for m in msgs[:3]:
                tx.send(m.encode())
            assert r1.channel("A", 0, "x").recv(timeout_s=30) == b"m0"
            assert ea.flush(30)
        for m in msgs[3:5]:  # while no receiver runs
            tx.send(m.encode())
        r2 = _role(workers["B"], job, "recv", {"count": 5})
        time.sleep(1.0)  # the order under test, either way round: the new start is there or about to be
        last = tx.send(msgs[5].encode())  # and once the new start is (or is about to be) there
        assert json.loads(_done(r2)) == msgs[1:]  # in order, each once: what r1 left, then the rest
        last.result(timeout=30)


def test_a_sender_killed_mid_stream_and_restarted_alone_on_a_host_whose_clock_is_behind_is_heard(workers):
    job = "sender-alone"
    with Endpoint.connect(workers["B"], job=job, rank=0) as eb:
        rx = eb.channel("A", 0, "x")
        old = [f"old{i}" for i in range(5)]
        s1 = _role(workers["A"], job, "send", {"msgs": old, "hold": True}, behind=0)
        got = [rx.recv(timeout_s=60).decode() for _ in range(3)]
        s1.kill()  # SIGKILL: no goodbye
        s1.wait(10)
        new = [f"new{i}" for i in range(3)]
        s2 = _role(workers["A"], job, "send", {"msgs": new})
        _done(s2)
        while True:
            try:
                got.append(rx.recv(timeout_s=2.0).decode())
            except TimeoutError:
                break
    # what the killed start had sent (each at most once, in order), then the new start's whole stream
    assert got[:3] == old[:3] and got[-3:] == new, got
    assert got[3:-3] == old[3:3 + len(got) - 6], got


def test_both_ends_restarted_on_hosts_whose_clocks_are_behind_take_only_the_new_stream(workers):
    job = "both"
    with Endpoint.connect(workers["A"], job=job, rank=0) as ea, \
            Endpoint.connect(workers["B"], job=job, rank=0) as eb:
        ea.channel("B", 0, "x").send(b"old0").result(30)
        assert eb.channel("A", 0, "x").recv(timeout_s=30) == b"old0"
        eb.close(flush_s=0)  # the receiver goes ...
        time.sleep(0.5)  # (the order under test: its end is on its way before the next sends)
        for m in (b"old1", b"old2"):  # ... these wait for it at switch B ...
            ea.channel("B", 0, "x").send(m).result(30)
        ea.close(flush_s=0)  # ... and the sender goes too
    r = _role(workers["B"], job, "recv", {"count": 3})
    s = _role(workers["A"], job, "send", {"msgs": ["new0", "new1", "new2"]}, behind=2 * DAY)
    _done(s)
    assert json.loads(_done(r)) == ["new0", "new1", "new2"]
