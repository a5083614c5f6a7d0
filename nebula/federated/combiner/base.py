"""What a combiner is and does between and around rounds.

Updates are pulled one at a time: a client announces its update (a small header on the control lane); the
combiner checks it (job, round, version, duplicate, example count, keys, shapes, dtypes) and only then asks for
the tensors, so a refused or late update never costs memory or waiting. Every refusal is answered with its reason
and audited: one record per asked client and round, and the ones a sender can repeat at will (late, uninvited,
duplicate, messages of another run) counted, one record per round and kind.

Run identity: each combiner process draws a nonce and tells it the controller in every status answer; the
controller's commands (round, async, model, stop) must name it, so a command of an earlier run (an earlier
controller, or a run of the same job whose state was wiped) is refused. Clients likewise say hello with their
own nonce, and every message to a client names it. Status answers carry the combiner's signed audit checkpoint,
which the controller keeps as a witness of the combiner's log.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import time
from pathlib import Path

from nebula.federated._actor import ActorAudit, JobGrants, RefusalTally
from nebula.federated.actor_channels import CLIENT_WINDOW, CONTROLLER_RANK, FIRST_CLIENT_RANK
from nebula.federated.checks import NONCE_CHARS, Refusal, check_hello
from nebula.federated.combiner.capabilities import CentralClip, FoldPolicy, fold_policy, round_kind
from nebula.federated.config import FederatedJob
from nebula.federated.messages import (ANY_START, SECURE_FROM_CLIENT, Bye, ClientHello, ClientUpdate, HelloRefused,
                                       StatusAnswer, StatusRequest, Stop, UpdateDropped)
from nebula.federated.strategy import get_strategy
from nebula.federated.transport import ActorMessenger
from nebula.messaging import Malformed, Message, Peer

__all__ = ["CombinerBase", "client_peers", "ANY_START", "FLUSH_S"]

log = logging.getLogger(__name__)
_SECURE = frozenset(m.TYPE for m in SECURE_FROM_CLIENT)
FLUSH_S = 10.0  # counted refusals are written to the audit log at least this often (and with every round)


def client_peers(job: FederatedJob) -> list[Peer]:
    """Every client rank the job names, in every cluster."""
    return [Peer(c.id, FIRST_CLIENT_RANK + i) for c in job.clusters for i in range(c.num_clients)]


class CombinerBase:
    """A combiner's state and what it does outside a round: status, hellos, refusals, commands, stop
    (`nebula.federated.combiner.Combiner` adds the serving loop)."""

    def __init__(self, job: FederatedJob, cluster: str, workdir: str | Path | None = None) -> None:
        self.job, self.cluster = job, cluster
        self.workdir = Path(workdir or Path(job.controller.dir) / f"combiner-{cluster}")
        self.strategy = get_strategy(job.strategy.name, job.strategy.options)
        # what the job's secure_aggregation and differential_privacy make of a round (combiner.capabilities): the
        # round that serves it (by name, in combiner.rounds.ROUNDS) and how each update in the clear is folded
        self.round_kind = round_kind(job)
        self.fold: FoldPolicy | CentralClip = fold_policy(job)
        self.roster: dict[Peer, int] = {}  # client -> training examples it holds
        self.nonces: dict[Peer, str] = {}  # client -> the nonce of its process (from its hello)
        self.missed: set[Peer] = set()  # asked last round, never answered: not offered again until heard from
        self.clients = client_peers(job)
        self.controller = Peer(job.controller.cluster, CONTROLLER_RANK)
        self.nonce = os.urandom(8).hex()  # this process: the controller's commands must name it
        self.known_version = 0
        self.tally = RefusalTally()
        self._flushed = time.monotonic()
        self.listen: frozenset[Peer] = frozenset()
        self.spool: Path | None = None
        self.mb: ActorMessenger | None = None
        self.audit: ActorAudit | None = None
        self.grants: JobGrants | None = None

    # the controller
    def command(self, msg: Message) -> Message | None:
        """A message of the controller: a status request is answered here; a command of this run is returned, to
        be served by the caller; None for anything else (a command of another run, or malformed: refused, counted)."""
        if isinstance(msg, StatusRequest):
            self.status(msg)
            return None
        return msg if self.ours(msg) else None

    def ours(self, msg: Message) -> bool:
        """Whether a command of the controller is of this run (names this process); refusals counted."""
        to = getattr(msg, "to", None)
        if to == self.nonce and not isinstance(msg, Malformed):
            return True
        what = msg.claimed if isinstance(msg, Malformed) else msg.TYPE
        why = Refusal("run", f"{str(what)[:32]} of another run (addressed to {str(to)[:32]}, this combiner is "
                             f"{self.nonce}): an earlier controller's, ignored") if not isinstance(msg, Malformed) \
            else Refusal("run", f"a malformed command ({msg.reason[:200]}), ignored")
        log.info("combiner %s: %s", self.cluster, why)
        self.tally.add("fl.control", why, str(self.controller), trail=False)
        return False  # (a model's pieces that follow are dropped as they come, being no header)

    def checkpoint(self) -> str | None:
        """This combiner's signed audit checkpoint (the controller keeps it as a witness of the log), as JSON."""
        from security.errors import AuditError

        try:
            return self.audit.log.checkpoint().to_json()
        except AuditError as exc:
            log.warning("combiner %s: no audit checkpoint to send (%s)", self.cluster, exc)
            return None

    def status(self, req: StatusRequest) -> None:
        self.run_seen = req.run  # (a combiner stopped by SIGTERM says goodbye to this run)
        self.mb.send(self.controller, StatusAnswer(
            seq=req.seq, run=req.run, nonce=self.nonce, roster={str(c): n for c, n in self.roster.items()},
            missed=tuple(sorted(str(c) for c in self.missed)), grant=self.grant_refusal(),
            checkpoint=self.checkpoint()))

    def stop(self, cmd: Stop) -> None:
        """End of the run: stop the clients, then send the controller the final signed head of the audit log."""
        for c in self.roster:
            self.stop_client(c)
        self.tally.flush(self.audit)
        self.audit.record("fl.stop", self.cluster, "ok", {"run": cmd.run})
        self.mb.send(self.controller, Bye(run=cmd.run, checkpoint=self.checkpoint()))

    def terminated(self) -> None:
        """SIGTERM: stop the clients, audit the stop and send the controller the final signed head of the audit log,
        as `stop` does, so the log's tail is witnessed (the controller takes a Bye at any time)."""
        for c in self.roster:
            self.stop_client(c)
        self.tally.flush(self.audit)
        run = getattr(self, "run_seen", None)
        self.audit.record("fl.stop", self.cluster, "terminated", {"run": run})
        log.warning("combiner %s: stopped by SIGTERM; closing checkpoint sent to the controller", self.cluster)
        self.mb.send(self.controller, Bye(run=run, checkpoint=self.checkpoint()))

    def stop_client(self, peer: Peer) -> None:
        """Stop on the channels of the client's current incarnation (naming its process) and of the next (a client
        restarted a moment ago, whose hello has not come in: its channel layer drops what is sent on the old
        channel, addressed to its predecessor). The next one's first: a client that is not restarted acknowledges
        it (unread) before the current one's makes it close, so the combiner's close does not wait for it."""
        inc = self.mb.incarnations.get(peer, 0)
        for e in reversed(range(inc, inc + CLIENT_WINDOW)):
            self.mb.send(peer, Stop(to=self.nonces.get(peer) if e == inc else ANY_START), epoch=e)

    def flush_if_due(self) -> None:
        if self.tally and time.monotonic() - self._flushed > FLUSH_S:
            self.tally.flush(self.audit)
            self._flushed = time.monotonic()

    # clients
    def to_client(self, peer: Peer, msg: Message) -> None:
        """A message to a client's process (naming its nonce, so no later process of the rank takes it)."""
        self.mb.send(peer, dataclasses.replace(msg, to=self.nonces.get(peer)))

    def take(self, got: tuple[Peer, Message, list | None], rnd=None) -> Message | None:
        """One polled message served: a client's here (within round `rnd`, if any); the controller's command of
        this run returned, to be served by the caller (see `command`)."""
        peer, msg, parts = got
        if peer != self.controller:
            self.from_client(peer, msg, rnd, parts)
            return None
        return self.command(msg)

    def from_client(self, peer: Peer, msg: Message, rnd=None, parts: list | None = None) -> None:
        """A client's message (`parts`: the pieces that came inline with it); `rnd`: the round in progress."""
        self.missed.discard(peer)  # heard from: offered again
        update = isinstance(msg, ClientUpdate) or (isinstance(msg, Malformed) and msg.claimed == "update")
        secure = isinstance(msg, SECURE_FROM_CLIENT) or (isinstance(msg, Malformed) and msg.claimed in _SECURE)
        if isinstance(msg, ClientHello):
            self.hello(peer, msg, rnd)
        elif (update or secure) and rnd is None:
            self.refuse(peer, msg, Refusal("late", "late: no round in progress at this combiner; a synchronous "
                                           "round never averages updates of another round"),
                        action="fl.secagg" if secure else "fl.update")
        elif update:
            rnd.on_update(peer, msg, parts)
        elif secure:
            rnd.on_secure(peer, msg, parts)

    def hello(self, peer: Peer, msg: ClientHello, rnd=None) -> None:
        why = check_hello(msg, job=self.job.job, max_examples=self.job.max_examples_per_client)
        if why is None:
            grant = self.grant_refusal()
            why = None if grant is None else Refusal("grant", grant)
        if why is not None:
            self.roster.pop(peer, None)
            log.info("combiner %s: refused client %s: %s", self.cluster, peer, why)
            self.tally.add("fl.hello", why, str(peer), trail=False)
            if isinstance(msg.nonce, str) and len(msg.nonce) <= NONCE_CHARS:
                self.nonces[peer] = msg.nonce
                self.to_client(peer, HelloRefused(reason=str(why)))
            return
        self.roster[peer], self.nonces[peer] = msg.num_examples, msg.nonce
        if rnd is not None:
            rnd.state.rejoined.add(peer)  # a restarted client: it is back, whatever its old process left undone

    def grant_refusal(self) -> str | None:
        """Why clients may not take part here (this cluster's account home holds no job grant for them), or None.

        The account is the one every rank of this job in this cluster speaks for: the switch routes by (account,
        job, rank) and refuses a worker's frame naming any account but its key's. The controller holds every
        cluster's answer (from the status answers) and assigns no client of a refused cluster to any combiner."""
        return None if self.grants is None else self.grants.refusal(self.mb.ep.cfg.account, self.job.job)

    def refuse(self, peer: Peer, msg: Message, why: Refusal, counted: bool = True, action: str = "fl.update"
               ) -> None:
        """Refuse an update (or, as `action` fl.secagg, a secure aggregation stage message) and tell the client;
        audited one by one, or `counted`. Nothing is read or waited for: pushed pieces come inside the header's
        message, and any other message that follows a refused header is dropped as it comes, being no header."""
        rnd, version = (msg.head.get("round"), msg.head.get("version")) if isinstance(msg, Malformed) \
            else (getattr(msg, "round", None), getattr(msg, "version", None))
        if counted:
            log.info("combiner %s: refused %s of %s: %s", self.cluster, action, peer, why)
            self.tally.add(action, why, str(peer))
        else:
            log.warning("combiner %s: refused %s of %s: %s", self.cluster, action, peer, why)
            self.audit.record(action, str(peer), "refused", {"reason": str(why), "round": rnd, "version": version})
        self.to_client(peer, UpdateDropped(round=rnd if isinstance(rnd, int) and not isinstance(rnd, bool) else None,
                                           reason=str(why)))
