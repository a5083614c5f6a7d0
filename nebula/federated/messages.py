"""The messages of FEDn's rounds, by the role that receives them: the controller (`TO_CONTROLLER`), a combiner
(`TO_COMBINER`) and a client (`TO_CLIENT`). Wire form and decoding: nebula.messaging.protocol.

Every command of the controller names the run (`run`: the controller start's epoch and a random session) and,
where it is one combiner's business, the combiner process (`to`: the nonce of its latest status answer); every
message of a combiner to a client names the client process (`to`: the nonce of its hello, or ANY_START for a stop
to whichever process of the client's next incarnation is there).

A round with secure aggregation (nebula.federated.secagg) adds its stages between a client and its combiner: the
secagg dataclasses themselves, whose families `TO_COMBINER` and `TO_CLIENT` include (secagg.messages.TO_SERVER,
TO_CLIENT): `sa_keys` (AdvertiseKeys), `sa_roster` (KeyRoster), `sa_shares` (ShareKeys), `sa_delivery`
(ShareDelivery: the Feldman commitments in one raw part after the header), `sa_check` (ShareCheck), `sa_verdict`
(ShareVerdict), `sa_masked` (MaskedInput: the words follow as a model of the one tensor MASKED_TENSOR, pushed inline
or pulled like an update; the signed weight in the header), `sa_survivors` (SurvivorSet), `sa_signed`
(SurvivorSignature), `sa_unmask` (UnmaskRequest), `sa_reveal` (UnmaskResponse). A client's stage message names the
client; the combiner refuses one that names another than the channel it came on.
"""
from __future__ import annotations

from dataclasses import field
from typing import Any

from nebula.federated.secagg import messages as secagg
from nebula.messaging import Message, MessageFamily, Untrusted

__all__ = ["TO_CONTROLLER", "TO_COMBINER", "TO_CLIENT", "ANY_START", "StatusRequest", "StartRound", "ModelCopy",
           "StartAsync", "NewModel", "Stop", "StatusAnswer", "Partial", "AsyncUpdate", "Bye", "ClientHello",
           "ClientUpdate", "TrainTask", "HelloRefused", "UpdateDropped", "PullUpdate", "GetParameters", "Parameters",
           "SECURE_FROM_CLIENT", "MASKED_TENSOR"]

TO_CONTROLLER = MessageFamily("controller")
TO_COMBINER = MessageFamily("combiner")
TO_CLIENT = MessageFamily("client")
ANY_START = "*"  # a combiner's stop to whichever process of a client's next incarnation is there


# ---- the controller to a combiner --------------------------------------------------------------------------------
@TO_COMBINER.message("status")
class StatusRequest(Message):
    """Who is there: the combiner answers with its roster, nonce, grant and audit checkpoint (`StatusAnswer`)."""

    seq: int
    run: str


@TO_COMBINER.message("round")
class StartRound(Message):
    """A synchronous round: the global model follows; fan it out to `clients`, report a `Partial`."""

    run: str
    to: str
    round: int
    version: int
    deadline_s: float
    clients: tuple[str, ...]
    config: dict[str, Any] = field(default_factory=dict)
    copies: int = 1  # the benchmark's broadcast without WAN-once: this many copies of the model follow


@TO_COMBINER.message("copy")
class ModelCopy(Message):
    """One more copy of a round's model (WAN-once off)."""

    round: int
    to: str


@TO_COMBINER.message("async")
class StartAsync(Message):
    """An asynchronous run: the model follows; every checked update goes straight on as an `AsyncUpdate`."""

    run: str
    to: str
    round: int
    version: int
    deadline_s: float
    clients: tuple[str, ...]
    config: dict[str, Any] = field(default_factory=dict)


@TO_COMBINER.message("model")
class NewModel(Message):
    """An asynchronous run's newest model (it follows)."""

    run: str
    to: str
    version: int


@TO_CLIENT.message("stop")
@TO_COMBINER.message("stop")
class Stop(Message):
    """End of the run (to a combiner: names the run and the combiner; to a client: names the client process)."""

    run: str | None = None
    to: str | None = None


# ---- a combiner to the controller --------------------------------------------------------------------------------
@TO_CONTROLLER.message("status")
class StatusAnswer(Message):
    """A combiner's answer: its clients (client -> examples), those that let it down, its process nonce, why its
    account home refuses the job (None: granted) and its signed audit checkpoint (JSON)."""

    seq: int | None = None
    run: str | None = None
    nonce: str
    roster: dict[str, Untrusted] = field(default_factory=dict)
    missed: tuple[str, ...] = ()
    grant: str | None = None
    checkpoint: str | None = None


@TO_CONTROLLER.message("partial")
class Partial(Message):
    """A combiner's partial aggregate of a round (the model follows when `num_updates` > 0)."""

    run: str | None = None
    round: int
    version: int
    num_updates: int
    num_examples: int
    clients: tuple[str, ...] = ()
    rejected: tuple[dict[str, Any], ...] = ()
    missing: tuple[str, ...] = ()
    metrics: dict[str, float] = field(default_factory=dict)
    eval_examples: int = 0
    update_bytes: int = 0
    update_norm_max: float = 0.0
    delta: bool = False  # the mean of the clients' changes (an update codec), not of their weights
    checkpoint: str | None = None
    weight: int | None = None  # its weight in the reducer's mean, when not num_examples (a secure sum's count;
    # under differential privacy, its number of updates: every client weighs the same)
    error_bound: float = 0.0  # secure aggregation: the fixed-point rounding's bound on each value of the mean
    dropped: tuple[str, ...] = ()  # secure aggregation: clients that shared keys but sent no masked input
    # secure aggregation: the bytes of its stage messages (keys, shares, masked headers, unmasking shares) from the
    # clients and to them; the masked words count in update_bytes, the model as without it
    protocol_bytes: tuple[int, int] = (0, 0)


@TO_CONTROLLER.message("async_update")
class AsyncUpdate(Message):
    """One checked update of an asynchronous run, passed on (the model follows)."""

    run: str | None = None
    client: str
    version: int
    num_examples: int


@TO_CONTROLLER.message("bye")
class Bye(Message):
    """A combiner's last word of a run: the final signed head of its audit log."""

    run: str | None = None
    checkpoint: str | None = None


# ---- a client to a combiner, and to the controller ---------------------------------------------------------------
@TO_COMBINER.message("hello")
class ClientHello(Message):
    """A client process says hello: its job, the examples it holds and its nonce (all checked by the combiner)."""

    job: Untrusted = None
    num_examples: Untrusted = None
    nonce: Untrusted = None


@TO_COMBINER.message("update")
class ClientUpdate(Message):
    """A client's update of a round: its header announces the model (pieces pushed inline, or pulled); every value
    is checked by the combiner before a byte of the model is taken (nebula.federated.checks)."""

    job: Untrusted = None
    round: Untrusted = None
    version: Untrusted = None
    num_examples: Untrusted = None
    metrics: Untrusted = None
    codec: str | None = None  # the job's update_codec, when the pieces are compressed changes
    pushed: bool = False


@TO_CONTROLLER.message("parameters")
class Parameters(Message):
    """A client's model, asked for the initial model of an empty trail (it follows, or comes inline)."""

    job: str | None = None
    run: str | None = None


# ---- a combiner or the controller to a client --------------------------------------------------------------------
@TO_CLIENT.message("task")
class TrainTask(Message):
    """Train the model that follows (or comes inline) and send an update within `deadline_s`."""

    round: int
    version: int
    config: dict[str, Any] = field(default_factory=dict)
    deadline_s: float
    push_bytes: int = 0  # an update up to this size is pushed with its header
    to: str | None = None
    # secure aggregation: the round's fresh session bytes and its clients at this combiner; the client derives
    # every other parameter from its own job file (nebula.federated.secagg.SecAggConfig.round_params)
    session: bytes | None = None
    cohort: tuple[str, ...] = ()


@TO_CLIENT.message("refused")
class HelloRefused(Message):
    """The combiner refuses the client (its cluster's account home grants it no part in the job, say)."""

    reason: str
    to: str | None = None


@TO_CLIENT.message("drop")
class UpdateDropped(Message):
    """The combiner refused an update; the reason says why and what to fix."""

    round: int | None = None
    reason: str
    to: str | None = None


@TO_CLIENT.message("pull")
class PullUpdate(Message):
    """The combiner takes the announced update: send its pieces."""

    round: int | None = None
    to: str | None = None


@TO_CLIENT.message("get_parameters")
class GetParameters(Message):
    """The controller asks for the client's model (the initial model of an empty trail); the answer names `run`."""

    run: str


# ---- secure aggregation's stages: a client and its combiner (nebula.federated.secagg.messages) ------------------
MASKED_TENSOR = "masked"  # the one tensor of a masked update: one word per parameter of the update
TO_COMBINER.include(secagg.TO_SERVER)
TO_CLIENT.include(secagg.TO_CLIENT)
SECURE_FROM_CLIENT = (secagg.AdvertiseKeys, secagg.ShareKeys, secagg.ShareCheck, secagg.MaskedInput,
                      secagg.SurvivorSignature, secagg.UnmaskResponse)
