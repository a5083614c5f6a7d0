"""What a combiner does with one synchronous round (`SyncRound`) or with an asynchronous run (`serve_async`)."""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import numpy as np

from nebula.federated._actor import Refusal, check_update_header
from nebula.federated.aggregate import RunningMean
from nebula.federated.intake import NONE_CODEC, GlobalModel, Refused, change_sumsq, receive_update
from nebula.federated.transport import PUSH_BYTES, Peer, manifest

if TYPE_CHECKING:
    from nebula.federated.combiner_base import CombinerBase as Combiner

__all__ = ["SyncRound", "serve_async", "PULL_GRACE_S"]

log = logging.getLogger(__name__)
PULL_GRACE_S = 2.0  # an update announced before the deadline may finish arriving this much later


class SyncRound:
    """One round at a combiner: the asked clients, the partial aggregate, the refusals."""

    @classmethod
    def serve(cls, comb: Combiner, head: dict) -> dict | None:
        """Take the round's model from the controller, fan it out, take the updates until the deadline, report.
        A command of the controller that comes meanwhile (a restarted controller's round: it waits for no partial
        of its predecessor's) ends the round unreported; it is returned, to be served next."""
        mb = comb.mb
        dl = float(head["deadline_s"])
        deadline = time.monotonic() + dl
        weights = mb.recv_model(comb.controller, head, dl)
        for _ in range(int(head.get("copies", 1)) - 1):  # the benchmark's broadcast without WAN-once
            nxt, _ = mb.recv(comb.controller, dl)
            mb.recv_model(comb.controller, nxt, dl, on_piece=lambda *a: None)
        comb.known_version = max(comb.known_version, int(head["version"]))
        rnd = cls(comb, head, weights, deadline)
        del weights  # the round drops it once fanned out
        try:
            rnd.fan_out()
            while rnd.waiting() and time.monotonic() < deadline:
                got = mb.poll(comb.listen, min(1.0, max(0.0, deadline - time.monotonic())))
                if got is None:
                    continue
                peer, h, parts = got
                if peer != comb.controller:
                    comb.from_client(peer, h, rnd, parts)
                elif comb.command(h) is not None:
                    log.warning("combiner %s: round %d given up: the controller sent a %s", comb.cluster, rnd.round,
                                str(h.get("type"))[:32])
                    return h
            rnd.report()
            return None
        finally:
            if rnd.base is not None:
                rnd.base.close()

    def __init__(self, comb: Combiner, head: dict, weights: dict[str, np.ndarray], deadline: float) -> None:
        self.c, self.head, self.weights, self.deadline = comb, head, weights, deadline
        self.round, self.version = int(head["round"]), int(head["version"])
        self.asked = [Peer.parse(s) for s in head["clients"]]
        self.expected = {str(p) for p in self.asked}
        self.tensors = manifest(weights)
        self.seen: set[str] = set()
        self.rejected: list[dict] = []  # the asked clients' refused answers (one each at most)
        self.accepted: list[str] = []
        self.rejoined: set[Peer] = set()
        self.streaming = comb.strategy.streaming
        self.mean = RunningMean(weights) if self.streaming else None
        # each update's change from this model is measured (raw updates; a coded update is a change already)
        job = comb.job
        measure = job.max_update_norm is not None and job.update_codec == NONE_CODEC
        self.base = GlobalModel(weights, comb.spool) if measure else None
        self.kept: list[tuple[dict, int]] = []
        self.names: list[str] = []
        self.metrics: dict[str, float] = {}
        self.eval_examples = 0
        self.update_bytes = 0  # what the accepted updates' pieces took on the wire
        self.norm_max = 0.0  # the largest change among the accepted updates (to choose max_update_norm by)

    def fan_out(self) -> None:
        task = {"type": "task", "round": self.round, "version": self.version, "config": self.head.get("config", {}),
                "deadline_s": max(0.0, self.deadline - time.monotonic()), "push_bytes": PUSH_BYTES}
        mb = self.c.mb
        big = sum(w.nbytes for w in self.weights.values()) > 64 * 1024**2
        for p in self.asked:
            # a small model goes inside the task's message; its pieces are views of self.weights (no copies)
            mine = {**task, "to": self.c.nonces.get(p)}
            parts = mb.inline_message(mine, self.weights)
            if parts is not None:
                mb.send_parts(p, parts)
            else:
                mb.send_model(p, mine, self.weights)
        if big:  # the channel holds those views until the clients acknowledge them: let them go before the updates
            mb.ep.flush(max(1.0, self.deadline - time.monotonic()) / 2)
        self.weights = None  # sent: from here on the combiner holds the partial and one update, no global model

    def waiting(self) -> bool:
        return bool(self.expected - self.seen)

    def on_update(self, peer: Peer, head: dict, parts: list | None = None) -> None:
        who = str(peer)
        job = self.c.job
        grant = self.c.grant_refusal()
        why = Refusal("grant", grant) if grant is not None else check_update_header(
            head, job=job.job, round=self.round, version=self.version, known_version=self.c.known_version,
            expected=self.expected, seen=self.seen, who=who, tensors=self.tensors,
            max_examples=job.max_examples_per_client)
        if why is not None:
            # an asked client's first answer for this round is recorded one by one; what a sender can repeat
            # (late, uninvited, duplicate, ...) is counted
            first = head.get("round") == self.round and who in self.expected and who not in self.seen
            if first:
                self.seen.add(who)  # a bad update for this round is this client's answer: stop waiting for it
                self.rejected.append({"client": who, "reason": str(why)})
            self.c.refuse(peer, head, why, counted=not first)
            return
        self.seen.add(who)
        self.accepted.append(who)
        if not head.get("pushed"):
            self.c.to_client(peer, {"type": "pull", "round": self.round})
        try:
            upd = receive_update(self.c.mb, peer, head, max(0.5, self.deadline - time.monotonic()) + PULL_GRACE_S,
                                 codec=job.update_codec, spool_dir=self.c.spool, inline=parts, base=self.base,
                                 max_norm=job.max_update_norm)
        except (Refused, ValueError) as exc:
            self._reject(peer, str(exc))
            return
        self.update_bytes += upd.nbytes
        self.norm_max = max(self.norm_max, upd.norm or 0.0)
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
        ne = m.get("eval_examples", 0) if isinstance(m, dict) else 0
        ne = ne if isinstance(ne, int) and 0 < ne <= job.max_examples_per_client else 0
        for k in ("eval_loss", "accuracy"):
            if isinstance(m.get(k), (int, float)) and np.isfinite(m[k]) and ne > 0:
                self.metrics[k] = self.metrics.get(k, 0.0) + float(m[k]) * ne
        self.eval_examples += ne
        self.c.audit.record("fl.update", who, "accepted", {"round": self.round, "num_examples": n,
                                                           "norm": upd.norm})

    def _reject(self, peer: Peer, reason: str) -> None:
        self.accepted.remove(str(peer))
        self.rejected.append({"client": str(peer), "reason": reason})
        self.c.audit.record("fl.update", str(peer), "refused", {"reason": reason, "round": self.round})
        log.warning("combiner %s: refused update of %s: %s", self.c.cluster, peer, reason)

    def report(self) -> None:
        c = self.c
        missing = [p for p in self.asked if str(p) not in self.seen]
        c.missed.update(p for p in missing if p not in self.rejoined)
        if self.streaming:
            num_updates, num_examples = self.mean.num_updates, self.mean.num_examples
            partial = self.mean.mean if num_updates else None
        else:
            num_updates, num_examples = len(self.kept), sum(n for _, n in self.kept)
            partial = c.strategy.combine(self.kept, self.names) if self.kept else None
        metrics = {k: v / self.eval_examples for k, v in self.metrics.items()} if self.eval_examples else {}
        rejected = self.rejected + c.tally.take()  # with what was refused since the last round, counted
        c.tally.flush(c.audit, round=self.round)
        header = {"type": "partial", "run": self.head.get("run"), "round": self.round, "version": self.version,
                  "num_updates": num_updates, "num_examples": num_examples, "clients": sorted(self.accepted),
                  "rejected": rejected, "missing": [str(p) for p in missing], "metrics": metrics,
                  "eval_examples": self.eval_examples, "update_bytes": self.update_bytes,
                  "update_norm_max": self.norm_max, "delta": c.job.update_codec != NONE_CODEC,
                  "checkpoint": c.checkpoint()}
        if partial is None:
            c.mb.send(c.controller, header)
        else:
            c.mb.send_model(c.controller, header, partial)


def serve_async(comb: Combiner, head: dict) -> str | None:
    """Serve an asynchronous run: every checked update goes straight to the controller, the client gets the
    newest model at once. Returns "stop" when the controller ends the run."""
    mb, job = comb.mb, comb.job
    dl = float(head["deadline_s"])
    latest = mb.recv_model(comb.controller, head, dl)
    version = comb.known_version = max(comb.known_version, int(head["version"]))
    asked = [Peer.parse(s) for s in head["clients"]]
    expected = {str(p) for p in asked}
    tensors = manifest(latest)
    config = head.get("config", {})

    def task(p: Peer) -> None:
        mb.send_model(p, {"type": "task", "round": version, "version": version, "config": config, "deadline_s": dl,
                          "push_bytes": PUSH_BYTES, "to": comb.nonces.get(p)}, latest, inline=True)

    for p in asked:
        task(p)
    while True:
        got = mb.poll(comb.listen, 1.0)
        comb.flush_if_due()
        if got is None:
            continue
        peer, h, parts = got
        kind = h.get("type")
        if peer == comb.controller:
            kind = comb.command(h)
            if kind == "stop":
                comb.stop(h)
                return "stop"
            if kind == "model":
                latest = mb.recv_model(comb.controller, h, dl)
                version = comb.known_version = int(h["version"])
            continue
        if kind == "hello":
            comb.hello(peer, h)
            continue
        if kind != "update":
            continue
        who = str(peer)
        grant = comb.grant_refusal()
        why = Refusal("grant", grant) if grant is not None else check_update_header(
            h, job=job.job, round=h.get("round"), version=h.get("version"), known_version=comb.known_version,
            expected=expected, seen=set(), who=who, tensors=tensors, max_examples=job.max_examples_per_client)
        if why is not None:
            comb.refuse(peer, h, why)  # no new task for it: a header refused at once is no answer to a task
            continue
        if not h.get("pushed"):
            comb.to_client(peer, {"type": "pull"})
        try:
            w = mb.recv_model(peer, h, dl, inline=parts)
            why = _async_refusal(w, latest, job.max_update_norm)
        except (TimeoutError, ValueError) as exc:
            why = Refusal("incomplete", f"incomplete update: {exc}")
        if why is not None:  # after a pull the client ignores the answer
            comb.refuse(peer, h, why)
        else:
            comb.audit.record("fl.update", who, "accepted", {"version": h["version"]})
            mb.send_model(comb.controller, {"type": "async_update", "run": head.get("run"), "client": who,
                                            "version": h["version"], "num_examples": h["num_examples"]}, w)
        if peer in asked:
            task(peer)


def _async_refusal(w: dict[str, np.ndarray], latest: dict[str, np.ndarray], max_norm: float | None
                   ) -> Refusal | None:
    """Why a received asynchronous update must be refused: non-finite values, or a change from the newest model
    this combiner holds over `max_norm`."""
    bad = next((k for k, v in w.items() if not np.isfinite(v).all()), None)
    if bad is not None:
        return Refusal("values", f"{bad!r} holds NaN or Inf; lower the learning rate or clip gradients")
    if max_norm is not None:
        norm = np.sqrt(sum(change_sumsq(v.reshape(-1), latest[k].reshape(-1)) for k, v in w.items()))
        if norm > max_norm:
            return Refusal("norm", f"the update's change from the newest model has an L2 norm of {norm:.4g}, over "
                                   f"the job's max_update_norm={max_norm:g}; lower the learning rate or clip it")
    return None
