"""What a combiner does with one synchronous round (`SyncRound`: the I/O around the pure `RoundState`) or with an
asynchronous run (`serve_async`). The rounds a combiner can serve are registered by name in `ROUNDS` ("sync" here,
"secure" in `combiner.secure`); `combiner.capabilities.round_kind` names the one a job's rounds take.

Each update is folded as the job's `combiner.capabilities.fold_policy` says: under central differential privacy the
combiner clips every update it folds to `clip_norm` itself (the L2 norm of its change from the round's model, as
decoded), whatever the client did: a client that skips its own clipping, or whose codec sends more than it clipped,
moves the sum by at most `clip_norm`. An update whose norm is not finite is refused; each one clipped is logged and
audited (`fl.update` "accepted" with `clipped`), and their count per round (`fl.dp` "clipped")."""
from __future__ import annotations

import dataclasses
import logging
import time
from collections import deque
from typing import TYPE_CHECKING

import numpy as np

from nebula.federated._actor import check_terminated
from nebula.federated.checks import Refusal, check_received, check_update_header
from nebula.federated.combiner.round_state import RoundState
from nebula.federated.intake import NONE_CODEC, GlobalModel, Refused, receive_update
from nebula.federated.messages import (AsyncUpdate, ClientHello, ClientUpdate, NewModel, PullUpdate, StartAsync,
                                       StartRound, Stop, TrainTask)
from nebula.messaging import PUSH_BYTES, Malformed, Message, Peer, manifest
from nebula.registry import Registry

if TYPE_CHECKING:
    from nebula.federated.combiner.base import CombinerBase as Combiner

__all__ = ["SyncRound", "serve_async", "PULL_GRACE_S", "ROUNDS"]

log = logging.getLogger(__name__)
PULL_GRACE_S = 2.0  # an update announced before the deadline may finish arriving this much later
# updates pulled beyond the one being received: the next one's transfer overlaps this one's checks and folding,
# while what waits in the combiner's channels stays bounded (and the first update is not slowed by many at once)
PULL_AHEAD = 2
# the rounds a combiner serves a StartRound with, by name (combiner.capabilities.round_kind chooses)
ROUNDS: Registry[type["SyncRound"]] = Registry("combiner round", lazy={"secure": "nebula.federated.combiner.secure"})


@ROUNDS.register("sync")
class SyncRound:
    """One round at a combiner: its state (`RoundState`), and the model, pulls and pieces around it."""

    clear_updates = True  # its clients' updates come in the clear (a secure round sees masked words only)

    @classmethod
    def serve(cls, comb: Combiner, cmd: StartRound) -> Message | None:
        """Take the round's model from the controller, fan it out, take the updates until the deadline, report.
        A command of the controller that comes meanwhile (a restarted controller's round: it waits for no partial
        of its predecessor's) ends the round unreported; it is returned, to be served next."""
        mb = comb.mb
        dl = cmd.deadline_s
        deadline = time.monotonic() + dl
        weights = mb.recv_model(comb.controller, cmd, dl)
        for _ in range(cmd.copies - 1):  # the benchmark's broadcast without WAN-once
            nxt, _ = mb.recv(comb.controller, dl)
            mb.recv_model(comb.controller, nxt, dl, on_piece=lambda *a: None)
        comb.known_version = max(comb.known_version, cmd.version)
        rnd = cls(comb, cmd, weights, deadline)
        del weights  # the round drops it once fanned out
        try:
            rnd.fan_out()
            command = rnd.collect()
            if command is not None:
                log.warning("combiner %s: round %d given up: the controller sent a %s", comb.cluster, cmd.round,
                            command.TYPE)
                return command
            rnd.report()
            return None
        finally:
            if rnd.base is not None:
                rnd.base.close()

    def collect(self) -> Message | None:
        """Take the clients' answers until the deadline; a command of the controller that came meanwhile, or None."""
        return self.pump(self.deadline)

    def pump(self, until: float) -> Message | None:
        """Serve the clients' messages while the round waits for one and `until` (a monotonic time) has not come;
        a command of the controller that came meanwhile (ending the round), or None. The update pulled first is
        received once its pieces come or PULL_AHEAD more are pulled, and the rest before the round ends."""
        comb = self.c
        command = None
        while command is None and self.state.waiting() and time.monotonic() < until:
            check_terminated()
            if self.pulled and (len(self.pulled) > PULL_AHEAD or comb.mb.channel(self.pulled[0][0]).pending()):
                self.receive_pulled()
                continue
            # a pulled client's channel carries its pieces next: they are read by `receive_pulled` alone, which
            # the first of them wakes
            listen = comb.listen - {p for p, _ in self.pulled}
            got = comb.mb.poll(listen, min(1.0, max(0.0, until - time.monotonic())),
                               wake=[self.pulled[0][0]] if self.pulled else ())
            if got is not None:
                command = comb.take(got, self)
        while self.pulled:  # (also when the round is given up: the channels stay in step)
            self.receive_pulled()
        return command

    def __init__(self, comb: Combiner, cmd: StartRound, weights: dict[str, np.ndarray], deadline: float) -> None:
        self.c, self.cmd, self.weights, self.deadline = comb, cmd, weights, deadline
        job = comb.job
        self.fold = comb.fold  # how each update is weighed and bounded (differential privacy: combiner.capabilities)
        self.state = self.make_state(asked=[Peer.parse(s) for s in cmd.clients], job=job.job, round=cmd.round,
                                     version=cmd.version, weights=weights, strategy=comb.strategy,
                                     max_examples=job.max_examples_per_client)
        self.clipped = 0  # updates clipped this round
        # each update's change from this model is measured (raw updates; a coded update is a change already)
        measure = (job.max_update_norm is not None or self.fold.measures) and job.update_codec == NONE_CODEC \
            and self.clear_updates
        self.base = GlobalModel(weights, comb.spool) if measure else None
        self.pulled: deque[tuple[Peer, ClientUpdate]] = deque()  # accepted headers whose pieces were asked for

    def make_state(self, **kw) -> RoundState:
        """The round's pure state (under differential privacy every update weighs the same)."""
        return RoundState(**kw, unit_weight=self.fold.unit_weight)

    def task(self) -> TrainTask:
        """The round's task, as every asked client gets it (each naming its own process)."""
        return TrainTask(round=self.cmd.round, version=self.cmd.version, config=self.cmd.config,
                         deadline_s=max(0.0, self.deadline - time.monotonic()), push_bytes=PUSH_BYTES)

    def fan_out(self) -> None:
        task = self.task()
        mb = self.c.mb
        big = sum(w.nbytes for w in self.weights.values()) > 64 * 1024**2
        # each client's task names its own process; the model's pieces are views of self.weights (no copies), each
        # sent to the switch once for all clients where the endpoint has slots
        mb.send_model_to({p: dataclasses.replace(task, to=self.c.nonces.get(p)) for p in self.state.asked},
                         self.weights)
        if big:  # the channel holds those views until the clients acknowledge them: let them go before the updates
            mb.ep.flush(max(1.0, self.deadline - time.monotonic()) / 2)
        self.weights = None  # sent: from here on the combiner holds the partial and one update, no global model

    def on_update(self, peer: Peer, msg: ClientUpdate | Malformed, parts: list | None = None) -> None:
        who, st = str(peer), self.state
        why = st.check(who, msg, known_version=self.c.known_version, grant=self.c.grant_refusal())
        if why is not None:
            first = st.refuse(who, msg, why)
            self.c.refuse(peer, msg, why, counted=not first)
            return
        st.accept(who)
        if not msg.pushed:
            self.c.to_client(peer, PullUpdate(round=st.round))
            self.pulled.append((peer, msg))
            return
        self.receive(peer, msg, parts)

    def receive_pulled(self) -> None:
        """Receive the update pulled first."""
        peer, msg = self.pulled.popleft()
        self.receive(peer, msg, None)

    def receive(self, peer: Peer, msg: ClientUpdate, parts: list | None) -> None:
        """Receive, check and fold an accepted update (`parts`: its pieces, when they came with its header)."""
        who, st, job = str(peer), self.state, self.c.job
        try:
            upd = receive_update(self.c.mb, peer, msg, max(0.5, self.deadline - time.monotonic()) + PULL_GRACE_S,
                                 codec=job.update_codec, spool_dir=self.c.spool, inline=parts, base=self.base,
                                 max_norm=job.max_update_norm)
        except (Refused, ValueError) as exc:
            self._refuse_received(peer, str(exc))
            return
        try:
            pieces, detail = self.fold.clip(upd.norm, upd.pieces(), self.base)
        except ValueError as exc:  # (its norm is not finite: it cannot be clipped)
            upd.close()
            self._refuse_received(peer, str(exc))
            return
        if detail.get("clipped"):
            self.clipped += 1
            log.warning("combiner %s: update of %s clipped from norm %.4g to clip_norm %g", self.c.cluster, peer,
                        upd.norm, detail["clip_norm"])
        try:
            st.fold(who, msg, pieces, nbytes=upd.nbytes, norm=upd.norm)
        finally:
            upd.close()
        self.c.audit.record("fl.update", who, "accepted", {"round": st.round, "num_examples": msg.num_examples,
                                                           "norm": upd.norm, **detail})

    def _refuse_received(self, peer: Peer, why: str) -> None:
        """An accepted header's update failed its checks: refused, audited."""
        self.state.reject(str(peer), why)
        self.c.audit.record("fl.update", str(peer), "refused", {"reason": why, "round": self.state.round})
        log.warning("combiner %s: refused update of %s: %s", self.c.cluster, peer, why)

    def on_secure(self, peer: Peer, msg: Message, parts: list | None = None) -> None:
        """A secure aggregation stage message in a round without it: refused, counted."""
        self.c.refuse(peer, msg, Refusal("uninvited", f"round {self.state.round} does not use secure aggregation; "
                                         "give the client this job's file"), action="fl.secagg")

    def report(self) -> None:
        c, st = self.c, self.state
        c.missed.update(p for p in st.missing() if p not in st.rejoined)
        counted = c.tally.take()  # what was refused since the last round, counted
        c.tally.flush(c.audit, round=st.round)
        for action, outcome, detail in self.fold.round_records(st.round, self.clipped):  # (central DP: fl.dp)
            c.audit.record(action, c.cluster, outcome, detail)
        partial, weights = st.partial(run=self.cmd.run, counted=counted, checkpoint=c.checkpoint(),
                                      delta=c.job.update_codec != NONE_CODEC)
        if weights is None:
            c.mb.send(c.controller, partial)
        else:
            c.mb.send_model(c.controller, partial, weights)


def serve_async(comb: Combiner, cmd: StartAsync) -> str | None:
    """Serve an asynchronous run: every checked update goes straight to the controller, the client gets the
    newest model at once. Returns "stop" when the controller ends the run."""
    mb, job = comb.mb, comb.job
    dl = cmd.deadline_s
    latest = mb.recv_model(comb.controller, cmd, dl)
    version = comb.known_version = max(comb.known_version, cmd.version)
    asked = [Peer.parse(s) for s in cmd.clients]
    expected = {str(p) for p in asked}
    tensors = manifest(latest)

    def task(p: Peer) -> None:
        mb.send_model(p, TrainTask(round=version, version=version, config=cmd.config, deadline_s=dl,
                              push_bytes=PUSH_BYTES, to=comb.nonces.get(p)), latest, inline=True)

    for p in asked:
        task(p)
    while True:
        check_terminated()
        got = mb.poll(comb.listen, 1.0)
        comb.flush_if_due()
        if got is None:
            continue
        peer, msg, parts = got
        if peer == comb.controller:
            command = comb.command(msg)
            if isinstance(command, Stop):
                comb.stop(command)
                return "stop"
            if isinstance(command, NewModel):
                latest = mb.recv_model(comb.controller, command, dl)
                version = comb.known_version = command.version
            continue
        if isinstance(msg, ClientHello):
            comb.hello(peer, msg)
            continue
        if not (isinstance(msg, ClientUpdate) or (isinstance(msg, Malformed) and msg.claimed == "update")):
            continue
        who = str(peer)
        grant = comb.grant_refusal()
        why = Refusal("grant", grant) if grant is not None else Refusal("malformed", msg.reason) \
            if isinstance(msg, Malformed) else check_update_header(
                msg, job=job.job, round=msg.round, version=msg.version, known_version=comb.known_version,
                expected=expected, seen=set(), who=who, tensors=tensors, max_examples=job.max_examples_per_client)
        if why is not None:
            comb.refuse(peer, msg, why)  # no new task for it: a header refused at once is no answer to a task
            continue
        if not msg.pushed:
            comb.to_client(peer, PullUpdate())
        try:
            w = mb.recv_model(peer, msg, dl, inline=parts)
            why = check_received(w, latest, job.max_update_norm)
        except (TimeoutError, ValueError) as exc:
            why = Refusal("incomplete", f"incomplete update: {exc}")
        if why is not None:  # after a pull the client ignores the answer
            comb.refuse(peer, msg, why)
        else:
            comb.audit.record("fl.update", who, "accepted", {"version": msg.version})
            mb.send_model(comb.controller, AsyncUpdate(run=cmd.run, client=who, version=msg.version,
                                                       num_examples=msg.num_examples), w)
        if peer in asked:
            task(peer)
