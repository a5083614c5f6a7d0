"""Nothing lost, nothing doubled, in order: across many cut WAN connections and a kill -9 of either switch."""
from __future__ import annotations

import contextlib
import hashlib
import random
import threading
import time
from pathlib import Path

import pytest

from nebula.channel import Endpoint
from nebula.config import split_host_port
from testbed.federation import edit_yaml, start_switch, wait_audit
from tests.switch.conftest import CuttingProxy, worker_yaml


def _message(i: int, rng: random.Random) -> bytes:
    body = rng.randbytes(rng.choice([10, 2000, 40_000, 300_000]))
    return i.to_bytes(8, "big") + hashlib.sha256(body).digest() + body


def _check(got: list[bytes], n: int) -> None:
    idx = [int.from_bytes(m[:8], "big") for m in got]
    assert len(set(idx)) == len(idx), "duplicates delivered"
    assert idx == list(range(n)), f"lost or out of order: first bad at {next(i for i, v in enumerate(idx) if v != i)}"
    for m in got:
        assert hashlib.sha256(m[40:]).digest() == m[8:40], "corrupted payload"


def _receive(ch, n: int, out: list, errors: list) -> None:
    try:
        for _ in range(n):
            out.append(ch.recv(timeout_s=90))
    except Exception as exc:  # reported by the test thread
        errors.append(exc)


@contextlib.contextmanager
def _stream(federation, n: int):
    """Yield channel A:0 -> B:0 with a receiver thread; on exit, all n messages arrived once each, in order."""
    with Endpoint.connect(worker_yaml(federation, "A"), job="j", rank=0) as ea, \
            Endpoint.connect(worker_yaml(federation, "B"), job="j", rank=0) as eb:
        got: list[bytes] = []
        errors: list = []
        t = threading.Thread(target=_receive, args=(eb.channel("A", 0, "stream"), n, got, errors))
        t.start()
        yield ea.channel("B", 0, "stream")
        t.join(180)
        assert not errors, errors
        _check(got, n)


@pytest.mark.slow
def test_many_cuts_mid_stream(procs, federation):
    ya = Path(federation["clusters"]["A"]["switch_yaml"])
    yb = Path(federation["clusters"]["B"]["switch_yaml"])
    to_b = CuttingProxy(split_host_port(federation["clusters"]["B"]["listen"]))
    to_a = CuttingProxy(split_host_port(federation["clusters"]["A"]["listen"]))
    edit_yaml(ya, lambda d: d["peers"][0].update(address=f"127.0.0.1:{to_b.port}"))
    edit_yaml(yb, lambda d: d["peers"][0].update(address=f"127.0.0.1:{to_a.port}"))
    start_switch(procs, ya), start_switch(procs, yb)
    n = 600
    rng = random.Random(7)
    msgs = [_message(i, rng) for i in range(n)]
    stop = threading.Event()

    def cutter() -> None:
        while not stop.wait(rng.uniform(0.05, 0.25)):
            (to_b if rng.random() < 0.7 else to_a).cut()

    c = threading.Thread(target=cutter)
    c.start()
    try:
        with _stream(federation, n) as tx:
            for i, m in enumerate(msgs):
                tx.send(m, lane="bulk" if i % 3 else "activation")
                if i % 20 == 0:
                    time.sleep(0.1)  # keep the stream running (about 3 s) while the cutter works
    finally:
        stop.set()
        c.join()
    assert to_b.cuts + to_a.cuts >= 15
    to_a.close()
    to_b.close()


@pytest.mark.slow
def test_kill9_and_restart_either_switch(procs, federation):
    ya = Path(federation["clusters"]["A"]["switch_yaml"])
    yb = Path(federation["clusters"]["B"]["switch_yaml"])
    a, b = start_switch(procs, ya), start_switch(procs, yb)
    n = 300
    rng = random.Random(3)
    msgs = [_message(i, rng) for i in range(n)]
    with _stream(federation, n) as tx:
        for i, m in enumerate(msgs):
            tx.send(m)
            if i == 100:
                b.kill9()
                b = start_switch(procs, yb)
            if i == 200:
                a.kill9()
                a = start_switch(procs, ya)
            time.sleep(0.005)
    assert wait_audit(b, lambda r: r["action"] == "switch_started" and r["detail"]["epoch"] == 2)
