"""Combiner: one per cluster, behind its switch. It takes the round's global model once over the WAN, fans it out
to its clients inside the cluster, checks and streams their updates into one partial model (about one model's
worth of memory for streaming strategies), and hands the partial with its example count to the reducer.

Updates are pulled one at a time: a client announces its update (a small header on the control lane); the
combiner checks it (job, round, version, duplicate, keys, shapes, dtypes) and only then asks for the tensors,
so a refused or late update never costs memory. Every refusal is audited and answered with its reason.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np

from nebula.channel import Endpoint
from nebula.federated._actor import ActorAudit, JobGrants, check_update_header
from nebula.federated.aggregate import RunningMean
from nebula.federated.config import FederatedJob
from nebula.federated.intake import NONE_CODEC, Refused, receive_update, spool_dir
from nebula.federated.strategy import get_strategy
from nebula.federated.transport import (COMBINER_RANK, CONTROLLER_RANK, FIRST_CLIENT_RANK, PUSH_BYTES, Mailbox, Peer,
                                        manifest, model_nbytes)

__all__ = ["Combiner", "client_peers"]

log = logging.getLogger(__name__)
PULL_GRACE_S = 2.0  # an update announced before the deadline may finish arriving this much later


def client_peers(job: FederatedJob) -> list[Peer]:
    """Every client rank the job names, in every cluster."""
    return [Peer(c.id, FIRST_CLIENT_RANK + i) for c in job.clusters for i in range(c.num_clients)]


class Combiner:
    """The combiner of `cluster` for `job`; `run()` serves until the controller says stop."""

    def __init__(self, job: FederatedJob, cluster: str, workdir: str | Path | None = None) -> None:
        self.job, self.cluster = job, cluster
        self.workdir = Path(workdir or Path(job.controller.dir) / f"combiner-{cluster}")
        self.strategy = get_strategy(job.strategy.name, job.strategy.options)
        self.roster: dict[Peer, int] = {}  # client -> training examples it holds
        self.missed: set[Peer] = set()  # asked last round, never answered: not offered again until heard from
        self.clients = client_peers(job)
        self.controller = Peer(job.controller.cluster, CONTROLLER_RANK)
        self.known_version = 0
        self.refused_between: list[dict] = []  # refusals while no round ran, reported with the next partial
        self.listen: frozenset[Peer] = frozenset()
        self.spool: Path | None = None
        self.mb: Mailbox | None = None
        self.audit: ActorAudit | None = None

    def run(self) -> None:
        """Connect to the switch and serve rounds until told to stop."""
        cl = self.job.cluster(self.cluster)
        ep = Endpoint.connect(cl.worker, job=self.job.job, rank=COMBINER_RANK, timeout_s=self.job.startup_timeout_s)
        self.mb = Mailbox(ep, self.job.piece_bytes, self.controller)
        self.mb.watch()  # look only at the channels that got something: a poll costs the same for 1000 clients
        self.listen = frozenset([*self.clients, self.controller])
        self.audit = ActorAudit(self.workdir, cl.worker, "combiner", self.cluster, COMBINER_RANK)
        self.spool = spool_dir(self.workdir)
        self.grants = JobGrants(cl.accounts_home) if cl.accounts_home else None
        log.info("combiner %s/%d ready", self.cluster, COMBINER_RANK)
        try:
            while True:
                got = self.mb.poll(self.listen, 1.0)
                if got is None:
                    continue
                peer, head, parts = got
                if peer == self.controller:
                    kind = head.get("type")
                    if kind == "stop":
                        for c in self.roster:
                            self.mb.send_to_every_start(c, {"type": "stop"})
                        return
                    if kind == "status":
                        self._status(head)
                    elif kind == "round":
                        self._round(head)
                    elif kind == "async":
                        if self._async(head) == "stop":
                            return
                else:
                    self._from_client(peer, head, None, parts)
        finally:
            self.audit.close()
            ep.close(flush_s=5)

    def _status(self, head: dict) -> None:
        roster = {str(c): n for c, n in self.roster.items()}
        self.mb.send(self.controller, {"type": "status", "seq": head.get("seq"), "roster": roster,
                                       "missed": sorted(str(c) for c in self.missed)})

    def _from_client(self, peer: Peer, head: dict, rnd: _Round | None, parts: list | None = None) -> None:
        """A client's message (`parts`: the pieces that came inline with it)."""
        kind = head.get("type")
        self.missed.discard(peer)  # heard from: offered again
        if kind == "hello":
            n = head.get("num_examples")
            if head.get("job") != self.job.job or not isinstance(n, int) or n <= 0:
                self.audit.record("fl.hello", str(peer), "refused", {"job": head.get("job"), "num_examples": n})
                return
            why = self.grant_refusal()
            if why is not None:
                self.roster.pop(peer, None)
                log.warning("combiner %s: refused client %s: %s", self.cluster, peer, why)
                self.audit.record("fl.hello", str(peer), "refused", {"reason": why})
                self.mb.send(peer, {"type": "refused", "reason": why})
                return
            self.roster[peer] = n
            if rnd is not None:
                rnd.rejoined.add(peer)  # a restarted client: it is back, whatever its old process left undone
        elif kind == "update":
            if rnd is None:
                reason = ("late: no round in progress at this combiner; a synchronous round never averages updates "
                          "of another round")
                self._discard_pushed(peer, head)
                self.refused_between.append({"client": str(peer), "reason": reason})
                self._refuse(peer, head, reason)
            else:
                rnd.on_update(peer, head, parts)

    def grant_refusal(self) -> str | None:
        """Why clients may not take part here (this cluster's account home holds no job grant for them), or None.

        The account is the one every rank of this job speaks for: the switch routes by (account, job, rank) and
        refuses a worker's frame naming any account but its key's, so a client's account is the job's."""
        return None if self.grants is None else self.grants.refusal(self.mb.ep.cfg.account, self.job.job)

    def _discard_pushed(self, peer: Peer, head: dict) -> None:
        """Read and drop the pieces of a refused update that came with its header (small ones only)."""
        if head.get("pushed") and 0 < model_nbytes(head.get("tensors") or []) <= PUSH_BYTES:
            try:
                self.mb.skip_pieces(peer, head, 5.0)
            except (TimeoutError, ValueError):
                pass

    def _refuse(self, peer: Peer, head: dict, reason: str) -> None:
        log.warning("combiner %s: refused update of %s: %s", self.cluster, peer, reason)
        self.audit.record("fl.update", str(peer), "refused",
                          {"reason": reason, "round": head.get("round"), "version": head.get("version")})
        self.mb.send(peer, {"type": "drop", "round": head.get("round"), "reason": reason})

    def _round(self, head: dict) -> None:
        mb = self.mb
        t0 = time.monotonic()
        deadline = t0 + float(head["deadline_s"])
        weights = mb.recv_model(self.controller, head, float(head["deadline_s"]))
        for _ in range(int(head.get("copies", 1)) - 1):  # the benchmark's broadcast without WAN-once
            nxt, _ = mb.recv(self.controller, float(head["deadline_s"]))
            mb.recv_model(self.controller, nxt, float(head["deadline_s"]), on_piece=lambda *a: None)
        self.known_version = max(self.known_version, int(head["version"]))
        rnd = _Round(self, head, weights, deadline)
        del weights  # the round drops it once fanned out
        rnd.fan_out()
        while rnd.waiting() and time.monotonic() < deadline:
            got = mb.poll(self.listen, min(1.0, max(0.0, deadline - time.monotonic())))
            if got is None:
                continue
            peer, h, parts = got
            if peer == self.controller:
                if h.get("type") == "status":
                    self._status(h)
                continue
            self._from_client(peer, h, rnd, parts)
        rnd.report()


    def _async(self, head: dict) -> str | None:
        """Serve an asynchronous run: every checked update goes straight to the controller, the client gets the
        newest model at once. Returns "stop" when the controller ends the run."""
        mb = self.mb
        dl = float(head["deadline_s"])
        latest = mb.recv_model(self.controller, head, dl)
        version = self.known_version = max(self.known_version, int(head["version"]))
        asked = [Peer.parse(s) for s in head["clients"]]
        tensors = manifest(latest)
        config = head.get("config", {})

        def task(p: Peer) -> None:
            mb.send_model(p, {"type": "task", "round": version, "version": version, "config": config,
                              "deadline_s": dl, "push_bytes": PUSH_BYTES}, latest, inline=True)

        for p in asked:
            task(p)
        while True:
            got = mb.poll(self.listen, 1.0)
            if got is None:
                continue
            peer, h, parts = got
            kind = h.get("type")
            if peer == self.controller:
                if kind == "stop":
                    for c in self.roster:
                        mb.send_to_every_start(c, {"type": "stop"})
                    return "stop"
                if kind == "status":
                    self._status(h)
                elif kind == "model":
                    latest = mb.recv_model(self.controller, h, dl)
                    version = self.known_version = int(h["version"])
                continue
            if kind == "hello":
                self._from_client(peer, h, None)
                continue
            if kind != "update":
                continue
            who = str(peer)
            reason = self.grant_refusal() or check_update_header(
                h, job=self.job.job, round=h.get("round"), version=h.get("version"), known_version=self.known_version,
                expected={str(p) for p in asked}, seen=set(), who=who, tensors=tensors)
            if reason is not None:
                self._discard_pushed(peer, h)
            if reason is None:
                if not h.get("pushed"):
                    mb.send(peer, {"type": "pull"})
                try:
                    w = mb.recv_model(peer, h, dl, inline=parts)
                    bad = next((k for k, v in w.items() if not np.isfinite(v).all()), None)
                    if bad is not None:
                        reason = f"{bad!r} holds NaN or Inf; lower the learning rate or clip gradients"
                except (TimeoutError, ValueError) as exc:
                    reason = f"incomplete update: {exc}"
            if reason is not None:
                self.audit.record("fl.update", who, "refused", {"reason": reason, "version": h.get("version")})
                mb.send(peer, {"type": "drop", "reason": reason})  # after a pull the client ignores it
            else:
                self.audit.record("fl.update", who, "accepted", {"version": h["version"]})
                mb.send_model(self.controller, {"type": "async_update", "session": head.get("session"),
                                                "client": who, "version": h["version"],
                                                "num_examples": h["num_examples"], "metrics": h.get("metrics", {})}, w)
            if peer in asked:
                task(peer)


class _Round:
    """One round at a combiner: the asked clients, the partial aggregate, the refusals."""

    def __init__(self, comb: Combiner, head: dict, weights: dict[str, np.ndarray], deadline: float) -> None:
        self.c, self.head, self.weights, self.deadline = comb, head, weights, deadline
        self.round, self.version = int(head["round"]), int(head["version"])
        self.asked = [Peer.parse(s) for s in head["clients"]]
        self.expected = {str(p) for p in self.asked}
        self.tensors = manifest(weights)
        self.seen: set[str] = set()
        self.rejected: list[dict] = comb.refused_between
        comb.refused_between = []
        self.accepted: list[str] = []
        self.rejoined: set[Peer] = set()
        self.streaming = comb.strategy.streaming
        self.mean = RunningMean(weights) if self.streaming else None
        self.kept: list[tuple[dict, int]] = []
        self.names: list[str] = []
        self.metrics: dict[str, float] = {}
        self.eval_examples = 0
        self.update_bytes = 0  # what the accepted updates' pieces took on the wire

    def fan_out(self) -> None:
        task = {"type": "task", "round": self.round, "version": self.version, "config": self.head.get("config", {}),
                "deadline_s": max(0.0, self.deadline - time.monotonic()), "push_bytes": PUSH_BYTES}
        big = sum(w.nbytes for w in self.weights.values()) > 64 * 1024**2
        # a small model goes inside the task's message, built once for every client; pieces are views of
        # self.weights (no copies)
        parts = self.c.mb.inline_message(task, self.weights)
        for p in self.asked:
            if parts is not None:
                self.c.mb.send_parts(p, parts)
            else:
                self.c.mb.send_model(p, task, self.weights)
        if big:  # the channel holds those views until the clients acknowledge them: let them go before the updates
            self.c.mb.ep.flush(max(1.0, self.deadline - time.monotonic()) / 2)
        self.weights = None  # sent: from here on the combiner holds the partial and one update, no global model

    def waiting(self) -> bool:
        return bool(self.expected - self.seen)

    def on_update(self, peer: Peer, head: dict, parts: list | None = None) -> None:
        who = str(peer)
        reason = self.c.grant_refusal() or check_update_header(
            head, job=self.c.job.job, round=self.round, version=self.version, known_version=self.c.known_version,
            expected=self.expected, seen=self.seen, who=who, tensors=self.tensors)
        if reason is not None:
            self.c._discard_pushed(peer, head)
            if head.get("round") == self.round and who in self.expected and not reason.startswith("duplicate"):
                self.seen.add(who)  # a bad update for this round is this client's answer: stop waiting for it
            self.rejected.append({"client": who, "reason": reason})
            self.c._refuse(peer, head, reason)
            return
        self.seen.add(who)
        self.accepted.append(who)
        if not head.get("pushed"):
            self.c.mb.send(peer, {"type": "pull", "round": self.round})
        try:
            upd = receive_update(self.c.mb, peer, head, max(0.5, self.deadline - time.monotonic()) + PULL_GRACE_S,
                                 codec=self.c.job.update_codec, spool_dir=self.c.spool, inline=parts)
        except (Refused, ValueError) as exc:
            self._reject(peer, head, str(exc))
            return
        self.update_bytes += upd.nbytes
        n = int(head["num_examples"])
        try:
            if self.streaming:  # checked whole, folded piece by piece
                self.mean.begin(n, who)
                for k, off, v in upd.pieces():
                    self.mean.add_part(k, v, off)
            else:
                w = {k: np.empty(s, d) for k, d, s in ((t[0], np.dtype(t[1]), tuple(t[2])) for t in self.tensors)}
                for k, off, v in upd.pieces():
                    w[k].reshape(-1)[off : off + v.size] = v
                self.kept.append((w, n))
                self.names.append(who)
        finally:
            upd.close()
        m = head.get("metrics") or {}
        ne = int(m.get("eval_examples", 0) or 0)
        for k in ("eval_loss", "accuracy"):
            if isinstance(m.get(k), (int, float)) and ne > 0:
                self.metrics[k] = self.metrics.get(k, 0.0) + float(m[k]) * ne
        self.eval_examples += ne
        self.c.audit.record("fl.update", who, "accepted", {"round": self.round, "num_examples": n})

    def _reject(self, peer: Peer, head: dict, reason: str) -> None:
        self.accepted.remove(str(peer))
        self.rejected.append({"client": str(peer), "reason": reason})
        self.c.audit.record("fl.update", str(peer), "refused", {"reason": reason, "round": self.round})
        log.warning("combiner %s: refused update of %s: %s", self.c.cluster, peer, reason)

    def report(self) -> None:
        missing = [p for p in self.asked if str(p) not in self.seen]
        self.c.missed.update(p for p in missing if p not in self.rejoined)
        if self.streaming:
            num_updates, num_examples = self.mean.num_updates, self.mean.num_examples
            partial = self.mean.mean if num_updates else None
        else:
            num_updates, num_examples = len(self.kept), sum(n for _, n in self.kept)
            partial = self.c.strategy.combine(self.kept, self.names) if self.kept else None
        metrics = {k: v / self.eval_examples for k, v in self.metrics.items()} if self.eval_examples else {}
        header = {"type": "partial", "session": self.head.get("session"), "round": self.round, "version": self.version,
                  "num_updates": num_updates,
                  "num_examples": num_examples, "clients": sorted(self.accepted), "rejected": self.rejected,
                  "missing": [str(p) for p in missing], "metrics": metrics, "eval_examples": self.eval_examples,
                  "update_bytes": self.update_bytes, "delta": self.c.job.update_codec != NONE_CODEC}
        if partial is None:
            self.c.mb.send(self.c.controller, header)
        else:
            self.c.mb.send_model(self.c.controller, header, partial)
