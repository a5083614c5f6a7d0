"""Errors a channel raises to the application."""
from __future__ import annotations

__all__ = ["ChannelError", "PeerUnavailable"]


class ChannelError(Exception):
    """A message was refused (the text gives the switch's reason) or the endpoint cannot work."""


class PeerUnavailable(ChannelError):
    """The peer cluster's switch (or our own) has been unreachable for longer than the timeout."""

    def __init__(self, cluster: str, message: str | None = None) -> None:
        super().__init__(message or f"cluster {cluster!r} is unreachable: its switch link is down")
        self.cluster = cluster
