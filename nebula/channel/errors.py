"""Errors a channel raises to the application."""
from __future__ import annotations

__all__ = ["ChannelError", "PeerUnavailable", "SwitchRefused"]


class ChannelError(Exception):
    """A message was refused (the text gives the switch's reason) or the endpoint cannot work."""


class PeerUnavailable(ChannelError):
    """The peer cluster's switch (or our own) has been unreachable for longer than the timeout."""

    def __init__(self, cluster: str, message: str | None = None) -> None:
        super().__init__(message or f"cluster {cluster!r} is unreachable: its switch link is down")
        self.cluster = cluster


class SwitchRefused(ChannelError):
    """Our switch refused this worker as it connected (its key, or its HELLO: job, rank, stage grants); the text is
    the switch's reason, naming the fix. Retrying does not help until the fix is made."""
