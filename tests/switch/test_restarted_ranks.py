"""A restarted rank takes nothing a switch kept for its predecessor: both ends of a channel restart while messages
addressed to the old receiver wait at its switch, and the new receiver gets exactly the new sender's stream (channel
sequence numbers start again at 1 in every process, so without incarnations the old #2 would stand in for the new
#2)."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from nebula.channel import Endpoint
from testbed.federation import start_switch
from tests.switch.conftest import worker_yaml


def test_a_restarted_rank_takes_nothing_its_predecessor_was_sent(procs, federation):
    start_switch(procs, Path(federation["clusters"]["A"]["switch_yaml"]))
    start_switch(procs, Path(federation["clusters"]["B"]["switch_yaml"]))
    wa, wb = worker_yaml(federation, "A"), worker_yaml(federation, "B")

    ea = Endpoint.connect(wa, job="j", rank=0)
    eb = Endpoint.connect(wb, job="j", rank=0)
    tx, rx = ea.channel("B", 0, "x"), eb.channel("A", 0, "x")
    tx.send(b"old-1").result(30)
    assert rx.recv(timeout_s=30) == b"old-1"
    time.sleep(0.5)  # the acknowledgement reaches the sender: it now addresses the receiver's incarnation
    eb.close(flush_s=0)  # the receiver dies ...
    time.sleep(0.5)  # (the order under test: its end is on its way to the switches before the next sends)
    for m in (b"old-2", b"old-3"):  # ... and switch B keeps these for rank 0 of job j until a rank 0 connects
        tx.send(m).result(30)
    time.sleep(1.0)  # (the order under test: they wait at switch B a while before the sender ends)
    ea.close(flush_s=0)  # the sender dies too: every cluster of the job restarts

    with Endpoint.connect(wa, job="j", rank=0) as ea2, Endpoint.connect(wb, job="j", rank=0) as eb2:
        rx2 = eb2.channel("A", 0, "x")
        tx2 = ea2.channel("B", 0, "x")
        for m in (b"new-1", b"new-2", b"new-3"):
            tx2.send(m)
        assert [rx2.recv(timeout_s=30) for _ in range(3)] == [b"new-1", b"new-2", b"new-3"]
        with pytest.raises(TimeoutError):
            rx2.recv(timeout_s=1.0)
        # the stream goes on both ways after the restart
        eb2.channel("A", 0, "back").send(b"reply")
        assert ea2.channel("B", 0, "back").recv(timeout_s=30) == b"reply"
