"""Lanes and flow control: a small activation overtakes a bulk transfer; switch memory stays under its cap."""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from nebula.channel import Endpoint
from testbed.federation import edit_yaml, start_switch
from tests.switch.conftest import worker_yaml


@pytest.mark.slow
def test_activation_overtakes_bulk(procs, federation):
    ya = Path(federation["clusters"]["A"]["switch_yaml"])
    # a 400 Mbit/s link: the 32 MiB bulk message needs about 0.7 s on it
    edit_yaml(ya, lambda d: d.setdefault("link", {}).update(shape={"rate_mbit": 400}))
    start_switch(procs, ya)
    start_switch(procs, Path(federation["clusters"]["B"]["switch_yaml"]))
    with Endpoint.connect(worker_yaml(federation, "A"), job="j", rank=0) as ea, \
            Endpoint.connect(worker_yaml(federation, "B"), job="j", rank=0) as eb:
        bulk_tx, act_tx = ea.channel("B", 0, "checkpoint"), ea.channel("B", 0, "activation")
        bulk_rx, act_rx = eb.channel("A", 0, "checkpoint"), eb.channel("A", 0, "activation")
        act_tx.send(b"warm-up")
        assert act_rx.recv(timeout_s=30) == b"warm-up"
        arrivals: dict[str, float] = {}

        def wait_bulk() -> None:
            bulk_rx.recv(timeout_s=60)
            arrivals["bulk"] = time.monotonic()

        t = threading.Thread(target=wait_bulk)
        t.start()
        bulk_tx.send(bytes(32 * 1024**2), lane="bulk")
        time.sleep(0.15)  # pacing, the order under test: the activation goes while the bulk transfer is under way
        act_tx.send(b"a" * 65536, lane="activation")
        assert act_rx.recv(timeout_s=30) == b"a" * 65536
        arrivals["activation"] = time.monotonic()
        t.join(60)
        assert arrivals["activation"] < arrivals["bulk"], arrivals


@pytest.mark.slow
def test_memory_cap_with_slow_receiver(procs, federation):
    cap = 8 * 1024**2
    for c in ("A", "B"):
        edit_yaml(Path(federation["clusters"][c]["switch_yaml"]),
                  lambda d: d.setdefault("link", {}).update(memory_cap_bytes=cap, retransmit_buffer_bytes=cap))
    a = start_switch(procs, Path(federation["clusters"]["A"]["switch_yaml"]))
    b = start_switch(procs, Path(federation["clusters"]["B"]["switch_yaml"]))
    n, size = 60, 1024**2
    peak = {"A": 0, "B": 0}
    # at most 16 MiB unread per channel (the sender's window); everything else waits at the sending worker
    with Endpoint.connect(worker_yaml(federation, "A"), job="j", rank=0, window_bytes=16 * 1024**2) as ea, \
            Endpoint.connect(worker_yaml(federation, "B"), job="j", rank=0) as eb:
        tx, rx = ea.channel("B", 0, "bulk"), eb.channel("A", 0, "bulk")
        for i in range(n):
            tx.send(i.to_bytes(4, "big") * (size // 4), lane="bulk")
        got = []
        for i in range(n):
            time.sleep(0.03)  # a slow receiver
            got.append(int.from_bytes(rx.recv(timeout_s=60)[:4], "big"))
            for sw in (a, b):
                st = json.loads((sw.config.parent / "state" / "status.json").read_text())
                peak[sw.cluster] = max(peak[sw.cluster], st["queued_bytes"])
        assert got == list(range(n))
    assert peak["A"] <= cap * 1.5 and peak["B"] <= cap * 1.5, peak
