"""The boundary counts the soak reads: a message counts as received when the step takes it (a sender running ahead
does not move it into an earlier step's record), and one that arrives twice under the same key is counted."""
from __future__ import annotations

import time

import numpy as np

from nebula.pipeline.links import LinkReceiver, LinkSender, LinkStats, queue_pair


def _until(pred, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_messages_count_when_taken_and_a_key_delivered_twice_is_counted():
    a, b = queue_pair()
    sent, got = LinkStats(), LinkStats()
    tx = LinkSender(a, "activation", sent)
    rx = LinkReceiver(b, got, peer_timeout_s=10, what="activations")
    try:
        for step in (1, 2):  # the sender runs a step ahead
            tx.send((step, 0, 0), np.full(3, step, np.float32), "none")
        tx.flush()
        _until(lambda: got.bytes_recv > 0 and len(rx._items) == 2)
        assert got.messages_recv == 0  # arrived, not taken
        assert rx.get((1, 0, 0))[0] == 1
        step1 = got.take()
        assert (step1.messages_recv, step1.messages_dup) == (1, 0)
        tx.send((2, 0, 0), np.full(3, 2, np.float32), "none")  # the same key again, before step 2 took it
        tx.flush()
        _until(lambda: got.bytes_recv > 0)
        assert rx.get((2, 0, 0))[0] == 2
        step2 = got.take()
        assert (step2.messages_recv, step2.messages_dup) == (1, 1)
        assert sent.take().messages_sent == 3
    finally:
        rx.close()
        tx.close()
