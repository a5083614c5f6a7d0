"""When a receiving worker acknowledges: pure state, no sockets and no clocks of its own.

An acknowledgement per message costs as much on every hop as a small message: the receiving worker frames it, both
switches parse and route it, the sender parses it. So acknowledgements are coalesced, as TCP delays its ACKs: a
channel that received ACK_EVERY messages or ACK_BYTES since its last acknowledgement is acknowledged at once, any
other owed acknowledgement (fewer messages, or only what the application consumed since) at most ACK_DELAY_S
later. Nothing waits on that delay but the sender's window and retransmit buffer, which both outlast it by far.
"""
from __future__ import annotations

__all__ = ["ACK_BYTES", "ACK_DELAY_S", "ACK_EVERY", "AckSchedule"]

ACK_EVERY = 4  # complete messages that make an acknowledgement due at once
ACK_BYTES = 1024**2  # or bytes received
ACK_DELAY_S = 0.002  # the most any other owed acknowledgement waits


class AckSchedule:
    """Receiving channels (by id) that owe an acknowledgement, and when it is due."""

    __slots__ = ("owed", "since", "urgent")

    def __init__(self) -> None:
        self.owed: dict[int, list[int]] = {}  # channel id -> [messages, bytes] since its last acknowledgement
        self.since: float | None = None  # when the oldest owed acknowledgement was first owed
        self.urgent = False

    def owe(self, cid: int, now: float, messages: int = 0, nbytes: int = 0) -> None:
        """Channel `cid` owes an acknowledgement: `messages` more complete messages of `nbytes` (0, 0: a duplicate,
        a consumption, an announcement)."""
        entry = self.owed.get(cid)
        if entry is None:
            entry = self.owed[cid] = [0, 0]
        entry[0] += messages
        entry[1] += nbytes
        if entry[0] >= ACK_EVERY or entry[1] >= ACK_BYTES:
            self.urgent = True
        if self.since is None:
            self.since = now

    @property
    def deadline(self) -> float | None:
        """When the owed acknowledgements are due at the latest (None: none are owed)."""
        return None if self.since is None else self.since + ACK_DELAY_S

    def due(self, now: float) -> bool:
        """Whether the owed acknowledgements should go now."""
        return self.since is not None and (self.urgent or now >= self.since + ACK_DELAY_S)

    def take(self) -> list[int]:
        """The channels that owe an acknowledgement; none owe one afterwards."""
        cids = list(self.owed)
        self.owed.clear()
        self.since = None
        self.urgent = False
        return cids
