"""Reliable delivery on one channel as pure state: sequence numbers, the sender's window, acknowledgements,
resends, chunking, and the receiver's reassembly and in-order delivery.

No sockets and no clocks: the I/O thread passes `now` in, sends the frames a `Sender` returns, and hands the
chunks it receives to a `Receiver`, which says what to acknowledge, deliver and release. What the receiver
consumed opens the sender's window (credit-based flow control from end to end).

Incarnations: every endpoint (one start of a worker process) has an incarnation number, which its switch gives
it (`switch_server.incarnations`: the switch's boot epoch and a counter, so a later start of the same rank has a
larger one whatever the hosts' clocks say) and checks on every frame it sends. A DATA frame carries its sender's
(`inc`) and the receiver's incarnation it is addressed to (`to`, learnt from the receiver's acknowledgements; 0
until then); an ACK carries the receiver's (`inc`) and the sender's it acknowledges (`to`). Sequence numbers start
again at 1 in every incarnation, and switches keep undelivered messages for a rank across its restarts, so
without these a restarted rank would take messages meant for its predecessor (or acknowledgements its predecessor
earned) as its own: a receiver drops messages from an earlier incarnation of its sender and starts the stream
afresh when a later one speaks; a sender ignores acknowledgements meant for an earlier incarnation of itself.

A receiver restarted alone announces itself: a message addressed to its predecessor is dropped and answered with
an acknowledgement of nothing from the new incarnation, and the sender, learning it, sends again, numbered from 1,
every message its predecessor had not consumed (a sender keeps each message until its receiver consumed it, which
the window bounds). Every acknowledgement is bounded by what the sender knows: one that claims more than was sent
is refused, and the channel goes on.
"""
from __future__ import annotations

from nebula.channel.receiver import MAX_AHEAD, Delivered, Outcome, Reassembly, Receiver
from nebula.channel.sender import RTO_BYTES_PER_S, RTO_MAX_S, RTO_S, Admitted, OutFrame, OutMessage, Sender

__all__ = ["MAX_AHEAD", "RTO_S", "RTO_MAX_S", "RTO_BYTES_PER_S", "OutMessage", "OutFrame", "Admitted", "Sender",
           "Delivered", "Reassembly", "Outcome", "Receiver"]
