"""When a receiving worker acknowledges (nebula.channel.acks), and that coalesced acknowledgements still open a
small window promptly through real switches."""
from __future__ import annotations

from nebula.channel.acks import ACK_BYTES, ACK_DELAY_S, ACK_EVERY, AckSchedule


def test_an_acknowledgement_is_due_at_once_after_enough_messages_or_bytes_else_after_the_delay():
    s = AckSchedule()
    assert not s.due(0.0) and s.deadline is None
    for _ in range(ACK_EVERY - 1):
        s.owe(7, 10.0, messages=1, nbytes=100)
    assert not s.due(10.0) and s.due(10.0 + ACK_DELAY_S) and s.deadline == 10.0 + ACK_DELAY_S
    s.owe(8, 10.001)  # (a consumption only: owed, not urgent; the oldest owed sets the deadline)
    assert s.deadline == 10.0 + ACK_DELAY_S
    s.owe(7, 10.001, messages=1)
    assert s.due(10.001)
    assert sorted(s.take()) == [7, 8] and not s.owed and s.deadline is None and not s.due(99.0)
    s.owe(3, 20.0, messages=1, nbytes=ACK_BYTES)
    assert s.due(20.0)
