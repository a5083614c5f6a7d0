"""FedOptima's messages between the server and each device, on the channel `fedoptima` (nebula.messaging:
the models as `Messenger.send_model` sends them, inline or in pieces; a batch of activations as one JSON header part
and one raw part per array). `TO_SERVER`: what a device sends; `TO_DEVICE`: what the server sends."""
from __future__ import annotations

import math
from dataclasses import field

from nebula.federated.messages import Stop
from nebula.messaging import Message, MessageFamily

__all__ = ["TO_SERVER", "TO_DEVICE", "DeviceHello", "Activations", "DeviceModel", "DeviceBye", "Init", "SendSlot",
           "AggregatedModel", "Stop"]

TO_SERVER = MessageFamily("fedoptima server")
TO_DEVICE = MessageFamily("fedoptima device")
MAX_STATS = 64  # a BYE's measurements: a handful of names; more is a peer filling the server's report


def _version(name: str, value: int, least: int = 0) -> None:
    """ValueError (the decoder's refusal) unless `value` >= `least`; the bounds that need the receiver's state (the
    versions it issued, the model's layers) are its handler's."""
    if value < least:
        raise ValueError(f"{name}={value} must be >= {least}")


@TO_SERVER.message("hello")
class DeviceHello(Message):
    """What a device says at initialisation: its FLOP/s and its upload bandwidth (the pre-processor's inputs)."""

    flops_per_s: float
    bandwidth_bytes_per_s: float

    def __post_init__(self) -> None:
        for name in ("flops_per_s", "bandwidth_bytes_per_s"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"{name}={v} must be a finite positive number (the device's measurement)")


@TO_SERVER.message("act")
class Activations(Message):
    """A batch of the device's activations and labels (arrays h, y), sent only under a grant."""


@TO_SERVER.message("model")
class DeviceModel(Message):
    """The device's model every H iterations (arrays d.*, a.*), trained from global model `version`."""

    version: int

    def __post_init__(self) -> None:
        _version("version", self.version)


@TO_SERVER.message("bye")
class DeviceBye(Message):
    """A device's answer to STOP: what it measured (idle and busy seconds, iterations, batches sent, rounds)."""

    stats: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.stats, dict) or len(self.stats) > MAX_STATS:
            raise ValueError(f"stats must be an object of at most {MAX_STATS} measurements")
        bad = next((k for k, v in self.stats.items() if not isinstance(k, str) or len(k) > 64 or isinstance(v, bool)
                    or not isinstance(v, (int, float)) or not math.isfinite(v)), None)
        if bad is not None:
            raise ValueError(f"stats {str(bad)[:64]!r}={str(self.stats[bad])[:32]} is not a short name with a "
                             "finite number")


@TO_DEVICE.message("init")
class Init(Message):
    """The split point and the initial device and auxiliary models (arrays d.*, a.*)."""

    split: int
    version: int

    def __post_init__(self) -> None:
        _version("split", self.split, 1)
        _version("version", self.version)


@TO_DEVICE.message("grant")
class SendSlot(Message):
    """A slot under ω: the device may send one batch of activations."""


@TO_DEVICE.message("global")
class AggregatedModel(Message):
    """The aggregated device and auxiliary models (arrays d.*, a.*), version `version`."""

    version: int

    def __post_init__(self) -> None:
        _version("version", self.version)


TO_DEVICE.message("stop")(Stop)
