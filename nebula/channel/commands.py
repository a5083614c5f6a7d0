"""What application threads ask of an endpoint's I/O thread: typed commands, taken in order by that thread alone."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nebula.channel.delivery import OutMessage

__all__ = ["Command", "OpenChannel", "Submit", "Watch"]


@dataclass(frozen=True, slots=True)
class OpenChannel:
    """Open a channel's two streams; `inbox` (a `streams.Inbox`) takes what arrives on it."""

    channel: Any  # streams.ChannelKeys
    inbox: Any


@dataclass(frozen=True, slots=True)
class Submit:
    """Queue a message on the sending stream `tx_id`."""

    tx_id: int
    msg: OutMessage


@dataclass(frozen=True, slots=True)
class Watch:
    """Start recording the channels that receive messages (Endpoint.watch)."""


Command = OpenChannel | Submit | Watch
