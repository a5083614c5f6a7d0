"""FedOptima's messages between the server and each device, on the channel `fedoptima` (nebula.messaging:
the models as `Messenger.send_model` sends them, inline or in pieces; a batch of activations as one JSON header part
and one raw part per array). `TO_SERVER`: what a device sends; `TO_DEVICE`: what the server sends."""
from __future__ import annotations

from dataclasses import field

from nebula.federated.messages import Stop
from nebula.messaging import Message, MessageFamily

__all__ = ["TO_SERVER", "TO_DEVICE", "DeviceHello", "Activations", "DeviceModel", "DeviceBye", "Init", "SendSlot",
           "AggregatedModel", "Stop"]

TO_SERVER = MessageFamily("fedoptima server")
TO_DEVICE = MessageFamily("fedoptima device")


@TO_SERVER.message("hello")
class DeviceHello(Message):
    """What a device says at initialisation: its FLOP/s and its upload bandwidth (the pre-processor's inputs)."""

    flops_per_s: float
    bandwidth_bytes_per_s: float


@TO_SERVER.message("act")
class Activations(Message):
    """A batch of the device's activations and labels (arrays h, y), sent only under a grant."""


@TO_SERVER.message("model")
class DeviceModel(Message):
    """The device's model every H iterations (arrays d.*, a.*), trained from global model `version`."""

    version: int


@TO_SERVER.message("bye")
class DeviceBye(Message):
    """A device's answer to STOP: what it measured (idle and busy seconds, iterations, batches sent, rounds)."""

    stats: dict[str, float] = field(default_factory=dict)


@TO_DEVICE.message("init")
class Init(Message):
    """The split point and the initial device and auxiliary models (arrays d.*, a.*)."""

    split: int
    version: int


@TO_DEVICE.message("grant")
class SendSlot(Message):
    """A slot under ω: the device may send one batch of activations."""


@TO_DEVICE.message("global")
class AggregatedModel(Message):
    """The aggregated device and auxiliary models (arrays d.*, a.*), version `version`."""

    version: int


TO_DEVICE.message("stop")(Stop)
