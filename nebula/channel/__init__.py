"""Worker-side channels through the switch server: addressed, ordered, exactly-once streams between ranks of a job."""
from nebula.channel.endpoint import Channel, ChannelError, Endpoint, PeerUnavailable
from nebula.channel.errors import SwitchRefused

__all__ = ["Channel", "ChannelError", "Endpoint", "PeerUnavailable", "SwitchRefused"]
