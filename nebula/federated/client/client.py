"""Clients: the API users write against (as in Flower: `fit` and `evaluate`), a Paddle helper, and the loop that
serves a combiner's tasks through the switch.

A client never opens a port: it connects to its cluster's switch as one rank of the job, says hello to every
combiner (so any of them can take it over when its own fails), and then answers tasks: evaluate the global
model it was sent, train it (`fit`), announce the update, and stream it once the combiner asks for it.

How it answers a task is chosen once from its job file (`task_answer`, the one place the client reads
`secure_aggregation` and `differential_privacy`): in the clear (`PlainTraining`, here) or under secure aggregation
(`client.secure.SecureTraining`), each with what it does to its update before it leaves
(`nebula.federated.privacy.release`: as trained, or clipped and noised).
"""
from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import time
from typing import Any, Mapping

import numpy as np

from nebula.channel import Endpoint
from nebula.federated.actor_channels import COMBINER_RANK, CONTROLLER_RANK, FIRST_CLIENT_RANK
from nebula.federated.client.answers import Answers, for_me, mb_peers
from nebula.federated.client.api import Client
from nebula.federated.client.secure import SecureTraining
from nebula.federated.config import FederatedJob
from nebula.federated.intake import NONE_CODEC, UpdateEncoder
from nebula.federated.messages import (ANY_START, ClientHello, ClientUpdate, GetParameters, HelloRefused,
                                       Parameters, PullUpdate, Stop, TrainTask)
from nebula.federated.privacy import AsTrained, Privatize, noise_rng
from nebula.federated.transport import ActorMessenger
from nebula.mean import Weights
from nebula.messaging import Peer, fits_inline, manifest, to_json

__all__ = ["Client", "PaddleClient", "run_client", "load_client", "ANY_START", "PlainTraining", "task_answer"]

log = logging.getLogger(__name__)
UPDATE_WINDOW_PIECES = 4  # pieces of an update in flight between a client and its combiner
# a client is one of many, idle most of the time: it says HELLO to its switch every 2.5 s, not every 1 s (the
# switch answers each with a WELCOME: a thousand clients cost it 400 instead of 1000 of each a second)
CLIENT_HEARTBEAT_S = 2.5
class PaddleClient(Client):
    """A `Client` training a user-supplied `paddle.nn.Layer` classifier on local arrays (x, y).

    `config` of a task may carry `proximal_mu` (FedProx: adds mu/2·||w − w_global||² to the loss), `epochs`,
    `lr` and `batch_size` overriding the constructor's.
    """

    def __init__(self, model: Any, train: tuple[np.ndarray, np.ndarray], test: tuple[np.ndarray, np.ndarray],
                 *, epochs: int = 1, batch_size: int = 32, lr: float = 1e-3, seed: int = 0) -> None:
        self.model, self.train, self.test = model, train, test
        self.epochs, self.batch_size, self.lr = epochs, batch_size, lr
        self.rng = np.random.default_rng(seed)

    def num_examples(self) -> int:
        return int(len(self.train[1]))

    def get_parameters(self, config: Mapping[str, Any]) -> Weights:
        return {k: v.numpy().copy() for k, v in self.model.state_dict().items()}

    def set_parameters(self, parameters: Mapping[str, np.ndarray]) -> None:
        """Load `parameters` into the model (names and shapes must match)."""
        import paddle

        self.model.set_state_dict({k: paddle.to_tensor(v) for k, v in parameters.items()})

    def fit(self, parameters: Weights, config: Mapping[str, Any]) -> tuple[Weights, int, dict]:
        import paddle
        import paddle.nn.functional as F

        self.set_parameters(parameters)
        mu = float(config.get("proximal_mu", 0.0))
        anchor = {k: paddle.to_tensor(v) for k, v in parameters.items()} if mu > 0 else None
        opt = paddle.optimizer.Adam(learning_rate=float(config.get("lr", self.lr)),
                                    parameters=self.model.parameters())
        x, y = self.train
        bs = int(config.get("batch_size", self.batch_size))
        self.model.train()
        losses, seen = [], 0
        for _ in range(int(config.get("epochs", self.epochs))):
            order = self.rng.permutation(len(y))
            for i in range(0, len(y), bs):
                idx = order[i : i + bs]
                logits = self.model(paddle.to_tensor(x[idx]))
                loss = F.cross_entropy(logits, paddle.to_tensor(y[idx].reshape(-1, 1)))
                if anchor is not None:
                    prox = sum(((p - anchor[n]) ** 2).sum() for n, p in self.model.named_parameters())
                    loss = loss + mu / 2 * prox
                loss.backward()
                opt.step()
                opt.clear_grad()
                losses.append(float(loss))
                seen += len(idx)
        return self.get_parameters(config), self.num_examples(), {"train_loss": float(np.mean(losses))}

    def evaluate(self, parameters: Weights, config: Mapping[str, Any]) -> tuple[float, int, dict]:
        import paddle
        import paddle.nn.functional as F

        self.set_parameters(parameters)
        self.model.eval()
        x, y = self.test
        with paddle.no_grad():
            logits = self.model(paddle.to_tensor(x))
            loss = float(F.cross_entropy(logits, paddle.to_tensor(y.reshape(-1, 1))))
            acc = float((logits.numpy().argmax(-1) == y).mean())
        return loss, int(len(y)), {"accuracy": acc}


def load_client(job: FederatedJob, cluster: str, index: int) -> Client:
    """Build the job's client (client.factory) for client `index` of `cluster`."""
    mod, _, fn = job.client.factory.partition(":")
    if not mod:
        raise ValueError("client.factory is empty in the job file; name a 'module:function' returning a Client")
    factory = getattr(importlib.import_module(mod), fn)
    return factory(cluster=cluster, index=index, num_clients={c.id: c.num_clients for c in job.clusters},
                   **job.client.args)


def run_client(job: FederatedJob, cluster: str, index: int, client: Client, *, stop_after_s: float | None = None
               ) -> int:
    """Serve tasks until a combiner or the controller says stop (or `stop_after_s` passes); rounds trained."""
    cl = job.cluster(cluster)
    rank = FIRST_CLIENT_RANK + index
    # a small send window: the combiner then holds at most this much of an update it is taking in (in flight,
    # not yet read), however large the model
    ep = Endpoint.connect(cl.worker, job=job.job, rank=rank, timeout_s=job.startup_timeout_s,
                          window_bytes=UPDATE_WINDOW_PIECES * job.piece_bytes, heartbeat_s=CLIENT_HEARTBEAT_S)
    mb = ActorMessenger(ep, job.piece_bytes, Peer(job.controller.cluster, CONTROLLER_RANK),
                 incarnation=_next_incarnation(job, cluster, index))
    mb.watch()  # an idle client sleeps until a message comes
    answer = task_answer(job)
    combiners = [Peer(c.id, COMBINER_RANK) for c in job.clusters]
    controller = Peer(job.controller.cluster, CONTROLLER_RANK)
    listen = mb_peers(job)
    me = f"{cluster}/{rank}"
    # this process's nonce: combiners name it in every message to us, so that nothing sent to an earlier process
    # of this rank (an earlier run's stop, say) is taken by this one
    nonce = os.urandom(8).hex()
    hello = ClientHello(job=job.job, num_examples=client.num_examples(), nonce=nonce)
    for c in combiners:
        mb.send(c, hello)
    trained = 0
    pending = None  # a task that arrived while we waited for a combiner's answer to our update
    last = Peer(cluster, COMBINER_RANK)  # the combiner that gave us work last: we block on its channel
    t_end = None if stop_after_s is None else time.monotonic() + stop_after_s
    try:
        while t_end is None or time.monotonic() < t_end:
            got, pending = pending or mb.poll(listen, 1.0, primary=last), None
            if got is None:
                continue
            peer, msg, parts = got
            if isinstance(msg, GetParameters) and peer == controller:  # the initial model: the answer names the run
                mb.send_model(peer, Parameters(job=job.job, run=msg.run), client.get_parameters({}))
                continue
            if not for_me(msg, nonce, me, peer):
                continue
            if isinstance(msg, Stop):
                break
            if isinstance(msg, HelloRefused):  # this combiner's cluster grants our account no part in the job
                log.warning("%s: combiner %s refused us: %s", me, peer, msg.reason)
            elif isinstance(msg, TrainTask):
                last = peer
                ok, pending = answer.answer(mb, peer, msg, client, job, me, parts, nonce)
                trained += ok
            else:  # an answer to an update we gave up on (the round moved on): nothing to do
                log.debug("%s: ignoring %s from %s", me, msg.TYPE, peer)
    finally:
        ep.close(flush_s=5)
    return trained


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class PlainTraining:
    """A client of a job without secure aggregation: each task's update in the clear (compressed with `encoder`, the
    job's update_codec, if any), after `release` (differential privacy's clip and noise, or as trained)."""

    encoder: UpdateEncoder | None
    release: AsTrained | Privatize

    def answer(self, mb: ActorMessenger, peer: Peer, task: TrainTask, client: Client, job: FederatedJob, me: str,
               parts: list | None, nonce: str) -> tuple[bool, Any]:
        """Run one task of combiner `peer`: (trained?, a message that came meanwhile, to be served next)."""
        return _train(mb, peer, task, client, job, me, self.encoder, parts, nonce, self.release)


def task_answer(job: FederatedJob) -> PlainTraining | SecureTraining:
    """How a client of `job` answers its tasks, as its job file says (read once, when the client starts)."""
    dp = job.differential_privacy
    release = AsTrained() if dp is None else Privatize(dp, noise_rng())
    if job.secure_aggregation is not None:
        return SecureTraining(release)  # (masked words stand in for the codec: nebula.federated.secagg.compose)
    encoder = UpdateEncoder(job.update_codec, job.piece_bytes) if job.update_codec != NONE_CODEC else None
    return PlainTraining(encoder, release)


def _train(mb: ActorMessenger, peer: Peer, task: TrainTask, client: Client, job: FederatedJob, me: str,
           encoder: UpdateEncoder | None = None, parts: list | None = None, nonce: str = "",
           release: AsTrained | Privatize = AsTrained()) -> tuple[bool, Any]:
    """Run one task (`parts`: the model's pieces that came with it): evaluate, fit, announce, stream on request
    (compressed with `encoder`, if any; `release`: what is done to the update before it leaves). (trained?, a task
    that came meanwhile)."""
    if task.session is not None:  # the combiner runs secure aggregation, this client's job file does not
        log.warning("%s: round %s asks for secure aggregation, which this client's job file does not set; give "
                    "every actor the same job file", me, task.round)
        return False, None
    params = mb.recv_model(peer, task, job.deadline_s, inline=parts)
    config = dict(task.config)
    # (under differential privacy no metric leaves the client, the accountant counts none: nothing is evaluated)
    metrics = release.evaluation(client.evaluate, params, config)
    weights, n, fm = client.fit(params, config)
    try:
        weights = release.weights(params, weights)
    except ValueError as exc:  # (differential privacy: the trained model is not shaped like the round's)
        log.warning("%s: round %s: %s", me, task.round, exc)
        return False, None
    update = ClientUpdate(job=job.job, round=task.round, version=task.version, num_examples=n,
                          metrics=release.metrics(metrics, fm) or {},  # (an update's metrics are a dict)
                          codec=None if encoder is None else encoder.spec)
    # small: one message, the pieces (raw, or each piece's change encoded, error feedback kept per piece) inside
    # it, no pull round trip; a combiner refuses pushed pieces that do not come with their header
    if sum(w.nbytes for w in weights.values()) <= task.push_bytes and fits_inline(manifest(weights), job.piece_bytes):
        pushed = dataclasses.replace(update, pushed=True)
        if encoder is None:
            mb.send_model(peer, pushed, weights, inline=True)
        else:
            frames = list(encoder.frames(weights, params))
            announce = mb.model_header(pushed, weights, inline=True, frames=[len(f) for f in frames])
            mb.send_parts(peer, [to_json(announce), *(p for f in frames for p in f)])
        return True, None
    mb.send(peer, mb.model_header(update, weights))

    def send() -> None:
        if encoder is None:
            mb.send_pieces(peer, weights)
        else:  # each piece's change from the global model, encoded (error feedback kept per piece)
            for frames in encoder.frames(weights, params):
                mb.send_parts(peer, frames)

    status, got = Answers(mb, peer, job, me, nonce).wait((PullUpdate,), time.monotonic() + job.deadline_s + 10,
                                                         f"update of round {task.round}")
    if status == "ok":
        send()
        return True, None
    return False, got if status == "pending" else None


def _next_incarnation(job: FederatedJob, cluster: str, index: int) -> int:
    """This start's incarnation of client `index` of `cluster`: one more than the last start's, kept in
    `<controller.dir>/clients/` on the client's host, so a restarted client talks on fresh channels."""
    from pathlib import Path

    d = Path(job.controller.dir) / "clients"
    d.mkdir(parents=True, exist_ok=True)
    f = d / f"{cluster}-{index}.incarnation"
    inc = int(f.read_text()) + 1 if f.exists() else 0
    f.write_text(str(inc))
    return inc
