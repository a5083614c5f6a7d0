"""Controller with the reducer (FEDn §3.4): the round protocol and the model trail.

Each synchronous round: ask every combiner for its status (participation), pick the round's clients and assign
each to its own cluster's combiner (or, when that one is gone, to the live combiner with the fewest), send the
global model once to each combiner (WAN-once), wait for the partials until the deadline (a combiner that has not
reported `REPORT_GRACE_S` after it is given up for this round), check the validity policy, reduce the partials
(example-weighted, streamed piece by piece), apply the strategy's server step, and commit to the trail.

Run identity, participation, grants, witnesses and the initial model: `nebula.federated.controller.base`;
asynchronous strategies: `nebula.federated.controller.asynchronous`. What secure aggregation and differential
privacy change in a round (who may take part, how partials are reduced and released, what the record keeps) the
round asks of `self.secure` and `self.privacy` (`nebula.federated.controller.capabilities`), whatever the job says.
"""
from __future__ import annotations

import json
import logging
import os
import time

import numpy as np

from nebula.channel import Endpoint
from nebula.federated._actor import ActorAudit, Terminated, check_terminated
from nebula.federated.actor_channels import CONTROLLER_RANK
from nebula.federated.controller.asynchronous import run_async
from nebula.federated.controller.base import ControllerBase
from nebula.federated.controller.capabilities import privacy_policy
from nebula.federated.controller.privacy import STOPPED
from nebula.federated.controller.reduction import Reduction
from nebula.federated.controller.trail import ModelTrail, RoundRecord
from nebula.federated.controller.witness import CombinerWitness
from nebula.federated.messages import ModelCopy, Partial, StartRound
from nebula.federated.transport import ActorMessenger
from nebula.messaging import Peer

__all__ = ["Controller", "REPORT_GRACE_S"]

log = logging.getLogger(__name__)
REPORT_GRACE_S = 3.0  # partials later than deadline + this are not waited for (the round ends within deadline + 5 s)


class Controller(ControllerBase):
    """The controller of `job`; `run()` runs the remaining rounds and returns the trail's head version."""

    def run(self) -> int:
        """Run rounds from the trail's head to `job.rounds`; the head version at the end."""
        cl = self.job.cluster(self.job.controller.cluster)
        ep = Endpoint.connect(cl.worker, job=self.job.job, rank=CONTROLLER_RANK, timeout_s=self.job.startup_timeout_s)
        epoch = self._next_epoch()
        self.run_id = f"{epoch}.{os.urandom(6).hex()}"
        self.mb = ActorMessenger(ep, self.job.piece_bytes, Peer(cl.id, CONTROLLER_RANK), epoch)
        self.mb.watch()  # woken by the message itself: a sweep with back-off found a partial up to 20 ms late
        self.trail = ModelTrail(self.dir / "trail")
        self.audit = ActorAudit(self.dir / "controller", cl.worker, "controller", cl.id, CONTROLLER_RANK)
        self.witness = CombinerWitness(self.dir / "controller", self.audit.log, self.audit.record)
        try:
            head = self.trail.head()
            if head is None:
                head = self.trail.get(self.initialise())
            self.privacy = privacy_policy(self.job, self.trail)  # (its accountant resumes from the trail)
            done = max([r.round for r in self.trail.rounds() if r.status != STOPPED] + [head.round])
            self.audit.record("fl.start", self.job.job, "ok", {"head": head.version, "next_round": done + 1})
            self.write_status("running", done, head.version)
            if not self.strategy.synchronous:
                run_async(self)
            else:
                for r in range(done + 1, self.job.rounds + 1):
                    check_terminated()
                    if self.stop_requested():
                        self.write_status("stopped", r - 1, self.trail.head().version)
                        break
                    exhausted = self.privacy.exhausted()
                    if exhausted is not None:
                        self._stop(r, exhausted, "budget", self.privacy.detail())
                        break
                    if self._round(r) is not None:  # no combiner can advance the model: stopped, status written
                        break
                else:
                    self.write_status("finished", self.job.rounds, self.trail.head().version)
            self.finish()
            return self.trail.head().version
        except Terminated:  # SIGTERM (a cluster's process): the status and the audit log say so; the trail is whole
            head = self.trail.head()
            self.audit.record("fl.stop", self.job.job, "terminated", {"head": head.version})
            self.write_status("stopped", head.round, head.version, reason="stopped by SIGTERM")
            return head.version
        finally:
            self.audit.close()
            self.trail.close()
            ep.close(flush_s=5)

    # one round
    def _round(self, r: int) -> str | None:
        """Run round `r`; why the job must stop instead (status, trail and audit written), or None."""
        job = self.job
        started = time.time()
        head = self.trail.head()
        weights, state = self.trail.load(head.version)
        # the first round of this process waits for every listed client (the job names them), later ones go on
        # with whoever is there
        want = None
        if not self._started:
            want = job.clients_per_round or sum(c.num_clients for c in job.clusters)
            self._started = True
        live, roster = self.wait_roster(job.validity.min_updates, want)
        # secure aggregation leaves out a combiner whose clients revealed a sum on this model in a round that did
        # not count (they refuse a second reveal: two sums would expose a client)
        admitted = self.secure.admit(r, live, head.version)
        if admitted.note is not None:
            log.warning("%s", admitted.note)
        if admitted.stop is not None:
            return self._stop(r, admitted.stop, "secure", {})
        live = admitted.live
        assignment = self.assign(live, roster, r)
        log.info("round %d: live combiners %s, %d clients connected", r, [str(c) for c in live], len(roster))
        expected_examples = sum(roster[p] for cl in assignment.values() for p in cl)
        t0 = time.monotonic()
        sent_before = {c: self.mb.sent_bytes.get(c, 0) for c in self.mb.sent_bytes}
        for comb, cl in assignment.items():
            copies = 1 if job.wan_once else len(cl)
            cmd = StartRound(run=self.run_id, to=self.nonces[comb], round=r, version=head.version,
                             deadline_s=job.deadline_s, clients=tuple(str(p) for p in cl),
                             config=self.strategy.client_options(), copies=copies)
            self.mb.send_model(comb, cmd, weights)
            for _ in range(copies - 1):
                self.mb.send_model(comb, ModelCopy(round=r, to=self.nonces[comb]), weights)
        home = job.controller.cluster
        self.wan_bytes.append(sum(n - sent_before.get(c, 0) for c, n in self.mb.sent_bytes.items() if c != home))
        red = Reduction(weights, coded=job.update_codec != "none" or self.secure.coded, update_codec=job.update_codec,
                        validity=job.validity, expected_examples=expected_examples, max_weight=self.secure.max_weight)
        # (with secure aggregation the combiners' unmask stage, then their sum: nebula.federated.combiner.secure)
        self._take_partials(r, assignment, red, t0 + job.deadline_s + REPORT_GRACE_S + self.secure.unmask_s)
        self.ask_status()  # the next round's (or the run's end's): answered while this round is reduced and committed
        metrics = red.metrics()
        spent = self.privacy.spend()  # every round run is counted
        metrics.update(self.privacy.metrics(spent))
        why, version = self.privacy.invalid(red), None
        if why is None:
            mean = self.privacy.release(red)
            new, state = self.strategy.server_step(weights, mean, state)
            bad = next((k for k, v in new.items() if not np.isfinite(v).all()), None)
            if bad is not None:  # finite updates can still overflow together: never commit such a model
                why = f"the new model's {bad!r} holds NaN or Inf (the updates overflowed); lower max_update_norm"
            else:
                version = self.trail.commit(new, parent=head.version, round=r, strategy=self.strategy.describe(),
                                            clients=sorted(red.clients),
                                            metrics={**metrics, "num_examples": red.num_examples}, state=state)
        duration = time.monotonic() - t0
        self.trail.record_round(RoundRecord(
            round=r, status="valid" if why is None else "invalid", version=version, num_updates=red.num_updates,
            num_examples=red.num_examples, rejected=red.rejected, started=started, duration_s=duration,
            detail={"why": why, "missing": red.missing, "lost_combiners": red.lost,
                    "expected_examples": expected_examples,
                    "assignment": {str(c): [str(p) for p in v] for c, v in assignment.items()}, **metrics,
                    "wan_bytes": self.wan_bytes[-1], "update_bytes": red.update_bytes,
                    "update_norm_max": red.norm_max, **self.secure.detail(red), **self.privacy.detail(spent)}))
        self.audit.record("fl.round", str(r), "valid" if why is None else "invalid",
                          {"version": version, "num_updates": red.num_updates, "why": why})
        log.info("round %d: %s, %d updates, %d examples, %.2f s %s", r, "valid" if why is None else f"invalid ({why})",
                 red.num_updates, red.num_examples, duration, json.dumps(metrics))
        self.secure.after_round(red, why, head.version)
        self.write_status("running", r, self.trail.head().version)
        return None

    def _stop(self, r: int, reason: str, outcome: str, detail: dict) -> str:
        """Round `r` may not run (`outcome` "budget": the job's target_epsilon forbids it; "secure": no combiner may
        advance the model): the trail (with `detail`), the audit log and the status say why the job stops."""
        log.warning("controller: %s", reason)
        self.trail.record_round(RoundRecord(
            round=r, status=STOPPED, version=None, num_updates=0, num_examples=0, rejected=[], started=time.time(),
            duration_s=0.0, detail={"why": reason, **detail}))
        self.audit.record("fl.stop", self.job.job, outcome, {"round": r, "reason": reason})
        self.write_status("stopped", r - 1, self.trail.head().version, reason=reason)
        return reason

    def _take_partials(self, r: int, assignment: dict[Peer, list[Peer]], red: Reduction, give_up: float) -> None:
        """Take the combiners' partials of round `r` until all came or `give_up` (a monotonic time)."""
        waiting = set(assignment)
        for peer, p in self.answers(waiting, give_up):
            if not isinstance(p, Partial) or p.round != r or p.run != self.run_id:
                self.discard(peer, p)
                continue
            waiting.discard(peer)
            self.witness.receive(peer.cluster, p.checkpoint)
            try:
                why = red.refusal(p, len(assignment[peer]))  # a combiner folds only the clients it was asked
                if why is not None:
                    raise ValueError(why)
                if p.num_updates:  # its clients revealed their sum on this model
                    red.revealed.append(peer)
                red.begin(p, f"combiner {peer}")
                if p.num_updates:
                    self.mb.recv_model(peer, p, max(1.0, give_up - time.monotonic()), on_piece=red.mean.add_part)
            except (TimeoutError, ValueError) as exc:
                red.lose(str(peer), broken=True)
                self.audit.record("fl.partial", str(peer), "refused", {"round": r, "reason": str(exc)})
                continue
            red.take(p)
        for c in sorted(waiting):
            clients = [str(p) for p in assignment[c]]
            red.lose(str(c), clients=clients)
            self.audit.record("fl.combiner", str(c), "lost", {"round": r, "clients": clients})
            log.warning("controller: combiner %s did not report round %d; its clients go elsewhere next round", c, r)
