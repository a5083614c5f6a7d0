"""What application threads ask of an endpoint's I/O thread: typed commands, taken in order by that thread alone."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nebula.channel.delivery import OutMessage

__all__ = ["Command", "OpenChannel", "Watch"]


@dataclass(frozen=True, slots=True)
class OpenChannel:
    """Open a channel's two streams; `inbox` (a `streams.Inbox`) takes what arrives on it."""

    channel: Any  # streams.ChannelKeys
    inbox: Any


@dataclass(frozen=True, slots=True)
class Watch:
    """Start recording the channels that receive messages (Endpoint.watch)."""


# a message to send is its own command (an OutMessage names its sending stream, `tx_id`): a wrapper per message
# would be one more object for the cyclic collector to visit while a burst of small messages waits
Command = OpenChannel | OutMessage | Watch
