"""Controller with the reducer (FEDn §3.4): the round protocol and the model trail.

Each synchronous round: ask every combiner for its status (participation), pick the round's clients and assign
each to its own cluster's combiner (or, when that one is gone, to the live combiner with the fewest), send the
global model once to each combiner (WAN-once), wait for the partials until the deadline (a combiner that has not
reported `REPORT_GRACE_S` after it is given up for this round), check the validity policy, reduce the partials
(example-weighted, streamed piece by piece), apply the strategy's server step, and commit to the trail.

Every message to a combiner names the run (`run`: this controller start's epoch and a random session) and its
commands name the combiner process (`to`: the nonce of its latest status answer), so no command of an earlier run
reaches a later one; answers of another run are dropped. Job grants hold across the federation: each combiner
reports whether its cluster's account home grants the job (`grant` in its status answer), and no client of a
cluster whose combiner refused, or has not said, is assigned to any combiner. The combiners' signed audit
checkpoints that come with their answers are kept as witnesses (`nebula.federated.witness`).
"""
from __future__ import annotations

import json
import logging
import os
import random
import time
from pathlib import Path
from typing import Any

from nebula.channel import Endpoint
import numpy as np

from nebula.federated._actor import ActorAudit
from nebula.federated.aggregate import RunningMean
from nebula.federated.config import FederatedJob
from nebula.federated.initial import fetch_initial, load_initial_model
from nebula.federated.strategy import get_strategy
from nebula.federated.trail import ModelTrail, RoundRecord
from nebula.federated.transport import COMBINER_RANK, CONTROLLER_RANK, Mailbox, Peer
from nebula.federated.witness import CombinerWitness

__all__ = ["Controller", "STOP_FILE", "STATUS_FILE", "REPORT_GRACE_S"]

log = logging.getLogger(__name__)
STOP_FILE = "STOP"
STATUS_FILE = "status.json"
STATUS_WAIT_S = 2.0  # a combiner that does not answer a status request this fast sits the round out
REPORT_GRACE_S = 3.0  # partials later than deadline + this are not waited for (the round ends within deadline + 5 s)
BYE_WAIT_S = 5.0  # how long the end of a run waits for the combiners' last checkpoints


class Controller:
    """The controller of `job`; `run()` runs the remaining rounds and returns the trail's head version."""

    def __init__(self, job: FederatedJob, workdir: str | Path | None = None) -> None:
        self.job = job
        self.dir = Path(workdir or job.controller.dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / STOP_FILE).unlink(missing_ok=True)  # a stop asked of an earlier run is not this run's
        self.strategy = get_strategy(job.strategy.name, job.strategy.options)
        self.combiners = [Peer(c.id, COMBINER_RANK) for c in job.clusters]
        self.mb: Mailbox | None = None
        self.trail: ModelTrail | None = None
        self.audit: ActorAudit | None = None
        self.witness: CombinerWitness | None = None
        self._seq = 0
        self._started = False
        self.run_id = ""  # "<epoch>.<session>": what every message of this run names (set by run())
        self.wan_bytes: list[int] = []  # bytes this controller sent to other clusters, per round
        self.accepted_by: dict[Peer, set[Peer]] = {}  # client -> the combiners that have it in their roster
        self.nonces: dict[Peer, str] = {}  # combiner -> the nonce of its process, from its latest status answer
        # cluster -> why its account home refuses the job (None: granted); only clusters with an accounts_home
        self.grant_of: dict[str, str | None] = {}
        self.guarded = {c.id for c in job.clusters if c.accounts_home}

    def run(self) -> int:
        """Run rounds from the trail's head to `job.rounds`; the head version at the end."""
        cl = self.job.cluster(self.job.controller.cluster)
        ep = Endpoint.connect(cl.worker, job=self.job.job, rank=CONTROLLER_RANK, timeout_s=self.job.startup_timeout_s)
        epoch = self._next_epoch()
        self.run_id = f"{epoch}.{os.urandom(6).hex()}"
        self.mb = Mailbox(ep, self.job.piece_bytes, Peer(cl.id, CONTROLLER_RANK), epoch)
        self.trail = ModelTrail(self.dir / "trail")
        self.audit = ActorAudit(self.dir / "controller", cl.worker, "controller", cl.id, CONTROLLER_RANK)
        self.witness = CombinerWitness(self.dir / "controller", self.audit.log, self.audit.record)
        try:
            head = self.trail.head()
            if head is None:
                head = self.trail.get(self._initialise())
            done = max([r.round for r in self.trail.rounds()] + [head.round])
            self.audit.record("fl.start", self.job.job, "ok", {"head": head.version, "next_round": done + 1})
            self._write_status("running", done, head.version)
            if not self.strategy.synchronous:
                from nebula.federated.controller_async import run_async

                run_async(self)
            else:
                for r in range(done + 1, self.job.rounds + 1):
                    if (self.dir / STOP_FILE).exists():
                        self._write_status("stopped", r - 1, self.trail.head().version)
                        break
                    self._round(r)
                else:
                    self._write_status("finished", self.job.rounds, self.trail.head().version)
            self._finish()
            return self.trail.head().version
        finally:
            self.audit.close()
            self.trail.close()
            ep.close(flush_s=5)

    def _next_epoch(self) -> int:
        """This start's epoch: one more than the last start's (kept beside the trail)."""
        f = self.dir / "epoch"
        epoch = int(f.read_text()) + 1 if f.exists() else 0
        f.write_text(str(epoch))
        return epoch

    def _finish(self) -> None:
        """Stop the combiners of this run (a last status learns the nonce of any that came late) and keep their
        last audit checkpoints."""
        live, _ = self._status()
        for c in live:
            self.mb.send(c, {"type": "stop", "run": self.run_id, "to": self.nonces[c]})
        waiting, deadline = set(live), time.monotonic() + BYE_WAIT_S
        while waiting and time.monotonic() < deadline:
            got = self.mb.poll(sorted(waiting), deadline - time.monotonic())
            if got is None:
                break
            peer, head, _ = got
            if head.get("type") == "bye" and head.get("run") == self.run_id:
                waiting.discard(peer)
                self.witness.receive(peer.cluster, head.get("checkpoint"), final=True)

    # participation
    def _status(self) -> tuple[list[Peer], dict[Peer, int]]:
        """(combiners that answered, the union of their rosters: client -> examples)."""
        self._seq += 1
        for c in self.combiners:
            self.mb.send(c, {"type": "status", "seq": self._seq, "run": self.run_id})
        live, roster, missed = [], {}, set()
        self.accepted_by = {}
        deadline = time.monotonic() + STATUS_WAIT_S
        waiting = set(self.combiners)
        while waiting and time.monotonic() < deadline:
            got = self.mb.poll(sorted(waiting), deadline - time.monotonic())
            if got is None:
                break
            peer, head, _ = got
            if head.get("type") != "status" or head.get("seq") != self._seq or head.get("run") != self.run_id:
                self._discard(peer, head)
                continue
            waiting.discard(peer)
            try:
                got_roster = {Peer.parse(c): int(n) for c, n in (head.get("roster") or {}).items()}
                missed.update(str(m) for m in head.get("missed") or [])
                nonce = head["nonce"]
            except (AttributeError, KeyError, TypeError, ValueError) as exc:
                log.warning("controller: malformed status answer from %s (%s); it sits this round out", peer, exc)
                continue
            live.append(peer)
            self.nonces[peer] = str(nonce)
            self._grant(peer.cluster, head.get("grant"))
            self.witness.receive(peer.cluster, head.get("checkpoint"))
            for c, n in got_roster.items():
                roster[c] = n
                self.accepted_by.setdefault(c, set()).add(peer)
        # a client that let its combiner down is not asked again until that combiner hears from it
        return sorted(live), {c: n for c, n in roster.items() if str(c) not in missed}

    def _grant(self, cluster: str, refusal: object) -> None:
        """Note what `cluster`'s combiner says of its account home's job grant (audited when it changes)."""
        if cluster not in self.guarded:
            return
        why = None if refusal is None else str(refusal)[:400]
        if cluster in self.grant_of and self.grant_of[cluster] == why:
            return
        self.grant_of[cluster] = why
        self.audit.record("fl.grant", cluster, "granted" if why is None else "refused", {"reason": why})
        if why is not None:
            log.warning("controller: cluster %s's clients take no part in the job: %s", cluster, why)

    def _client_refusal(self, p: Peer) -> str | None:
        """Why client `p` may not train through any combiner (its own cluster's grant), or None."""
        if p.cluster not in self.guarded:
            return None
        if p.cluster not in self.grant_of:
            return f"cluster {p.cluster}'s combiner has not said whether its account home grants the job"
        return self.grant_of[p.cluster]

    def _discard(self, peer: Peer, head: dict) -> None:
        """Drop a message of an earlier round or run (consuming the model pieces that follow it)."""
        log.info("controller: dropping a late %s from %s (round %s)", str(head.get("type"))[:32], peer,
                 str(head.get("round"))[:32])
        if "piece_bytes" in head and not head.get("inline"):  # (inline pieces came with it)
            try:
                self.mb.recv_model(peer, head, self.job.deadline_s, on_piece=lambda *a: None)
            except (TimeoutError, ValueError) as exc:
                log.warning("controller: pieces of a dropped %s from %s: %s", str(head.get("type"))[:32], peer, exc)

    def _wait_roster(self, need: int, want: int | None = None) -> tuple[list[Peer], dict[Peer, int]]:
        """Live combiners and roster once `need` clients are connected; up to `startup_timeout_s` for `want`."""
        t0 = time.monotonic()
        deadline = t0 + self.job.startup_timeout_s
        while True:
            live, roster = self._status()
            if live and len(roster) >= (want or need) and (not want or len(live) == len(self.combiners)):
                return live, roster
            if live and len(roster) >= need and want and time.monotonic() > t0 + self.job.startup_timeout_s / 2:
                return live, roster
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(roster)} clients reached {len(live)} combiners within "
                                   f"{self.job.startup_timeout_s} s, {need} needed; start more clients or lower "
                                   "validity.min_updates")
            time.sleep(0.5)

    def _initialise(self) -> int:
        """An empty trail: the job's initial_model file, or the model most of the asked clients agree on
        (nebula.federated.initial), committed as version 1."""
        job = self.job
        if job.initial_model is not None:
            weights, who, clients = load_initial_model(job), f"file {job.initial_model}", []
        else:
            # as many clients as will be asked, or as round 1 waits for
            self._wait_roster(1, min(job.initial_clients, job.clients_per_round or sum(c.num_clients for c in
                                                                                      job.clusters)))

            def audit(client: str, outcome: str, detail: dict) -> None:
                self.audit.record("fl.initial", client, outcome, detail)

            weights, who = fetch_initial(self.mb, job, self.run_id, lambda: self._status()[1], audit)
            clients = [who]
        return self.trail.commit(weights, parent=None, round=0, strategy=self.strategy.describe(), clients=clients,
                                 metrics={"initialised_by": who})

    def _assign(self, live: list[Peer], roster: dict[Peer, int], r: int) -> dict[Peer, list[Peer]]:
        clients = sorted(roster)
        k = self.job.clients_per_round or len(clients)
        chosen = sorted(random.Random(self.job.seed * 100003 + r).sample(clients, min(k, len(clients))))
        out: dict[Peer, list[Peer]] = {c: [] for c in live}
        for p in chosen:
            if self._client_refusal(p) is not None:  # its own cluster grants it no part: through no combiner
                continue
            home = Peer(p.cluster, COMBINER_RANK)
            # only a combiner that accepted the client (one whose cluster grants it the job) takes it
            took = [c for c in out if c in self.accepted_by.get(p, ())]
            if not took:
                continue
            target = home if home in took else min(took, key=lambda c: (len(out[c]), c))
            if target != home:
                log.info("controller: client %s reassigned to combiner %s (its own is gone)", p, target)
            out[target].append(p)
        return {c: v for c, v in out.items() if v}

    # one round
    def _round(self, r: int) -> None:
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
        live, roster = self._wait_roster(job.validity.min_updates, want)
        assignment = self._assign(live, roster, r)
        log.info("round %d: live combiners %s, %d clients connected", r, [str(c) for c in live], len(roster))
        expected_examples = sum(roster[p] for cl in assignment.values() for p in cl)
        t0 = time.monotonic()
        sent_before = {c: self.mb.sent_bytes.get(c, 0) for c in self.mb.sent_bytes}
        for comb, cl in assignment.items():
            copies = 1 if job.wan_once else len(cl)
            hdr = {"type": "round", "run": self.run_id, "to": self.nonces[comb], "round": r, "version": head.version,
                   "deadline_s": job.deadline_s,
                   "clients": [str(p) for p in cl], "config": self.strategy.client_options(), "copies": copies}
            self.mb.send_model(comb, hdr, weights)
            for _ in range(copies - 1):
                self.mb.send_model(comb, {"type": "copy", "round": r, "to": self.nonces[comb]}, weights)
        home = job.controller.cluster
        self.wan_bytes.append(sum(n - sent_before.get(c, 0) for c, n in self.mb.sent_bytes.items() if c != home))
        reducer = RunningMean(weights)
        coded = job.update_codec != "none"  # then combiners average the clients' changes, not their weights
        update_bytes = 0
        clients, rejected, missing, lost = [], [], [], []
        num_updates, norm_max = 0, 0.0
        metric_sums: dict[str, float] = {}
        eval_examples = 0
        waiting = set(assignment)
        broken = False
        give_up = t0 + job.deadline_s + REPORT_GRACE_S
        while waiting and time.monotonic() < give_up:
            got = self.mb.poll(sorted(waiting), give_up - time.monotonic())
            if got is None:
                break
            peer, h, _ = got
            if h.get("type") != "partial" or h.get("round") != r or h.get("run") != self.run_id:
                self._discard(peer, h)
                continue
            waiting.discard(peer)
            self.witness.receive(peer.cluster, h.get("checkpoint"))
            try:
                if bool(h.get("delta")) != coded:
                    raise ValueError(f"partial is {'a change' if h.get('delta') else 'weights'}, the job's "
                                     f"update_codec={job.update_codec!r} makes it {'a change' if coded else 'weights'}")
                if h["num_updates"]:
                    reducer.begin(int(h["num_examples"]), f"combiner {peer}")
                    self.mb.recv_model(peer, h, max(1.0, give_up - time.monotonic()), on_piece=reducer.add_part)
            except (TimeoutError, ValueError) as exc:
                lost.append(str(peer))
                self.audit.record("fl.partial", str(peer), "refused", {"round": r, "reason": str(exc)})
                broken = True  # a half-folded partial cannot be taken out again: the round is invalid
                continue
            num_updates += int(h["num_updates"])
            update_bytes += int(h.get("update_bytes", 0))
            norm_max = max(norm_max, float(h.get("update_norm_max") or 0.0))
            clients += h.get("clients", [])
            rejected += h.get("rejected", [])
            missing += h.get("missing", [])
            ne = int(h.get("eval_examples", 0))
            for k, v in (h.get("metrics") or {}).items():
                metric_sums[k] = metric_sums.get(k, 0.0) + float(v) * ne
            eval_examples += ne
        for c in sorted(waiting):
            lost.append(str(c))
            missing += [str(p) for p in assignment[c]]
            self.audit.record("fl.combiner", str(c), "lost", {"round": r, "clients": [str(p) for p in assignment[c]]})
            log.warning("controller: combiner %s did not report round %d; its clients go elsewhere next round", c, r)
        metrics = {f"parent_{k}": v / eval_examples for k, v in metric_sums.items()} if eval_examples else {}
        num_examples = reducer.num_examples
        why = "a partial model broke off mid-transfer" if broken else self._invalid(num_updates, num_examples,
                                                                                      expected_examples)
        version = None
        if why is None:
            mean = reducer.result()
            if coded:
                mean = {k: weights[k] + mean[k] for k in weights}
            new, state = self.strategy.server_step(weights, mean, state)
            bad = next((k for k, v in new.items() if not np.isfinite(v).all()), None)
            if bad is not None:  # finite updates can still overflow together: never commit such a model
                why = f"the new model's {bad!r} holds NaN or Inf (the updates overflowed); lower max_update_norm"
            else:
                version = self.trail.commit(new, parent=head.version, round=r, strategy=self.strategy.describe(),
                                            clients=sorted(clients), metrics={**metrics, "num_examples": num_examples},
                                            state=state)
        duration = time.monotonic() - t0
        self.trail.record_round(RoundRecord(
            round=r, status="valid" if why is None else "invalid", version=version, num_updates=num_updates,
            num_examples=num_examples, rejected=rejected, started=started, duration_s=duration,
            detail={"why": why, "missing": missing, "lost_combiners": lost, "expected_examples": expected_examples,
                    "assignment": {str(c): [str(p) for p in v] for c, v in assignment.items()}, **metrics,
                    "wan_bytes": self.wan_bytes[-1], "update_bytes": update_bytes, "update_norm_max": norm_max}))
        self.audit.record("fl.round", str(r), "valid" if why is None else "invalid",
                          {"version": version, "num_updates": num_updates, "why": why})
        log.info("round %d: %s, %d updates, %d examples, %.2f s %s", r, "valid" if why is None else f"invalid ({why})",
                 num_updates, num_examples, duration, json.dumps(metrics))
        self._write_status("running", r, self.trail.head().version)

    def _invalid(self, num_updates: int, num_examples: int, expected: int) -> str | None:
        v = self.job.validity
        if num_updates < v.min_updates:
            return f"{num_updates} updates < validity.min_updates={v.min_updates}"
        if expected and num_examples < v.min_fraction_examples * expected:
            return (f"{num_examples} examples < validity.min_fraction_examples={v.min_fraction_examples} of "
                    f"{expected} expected")
        return None

    def _write_status(self, state: str, r: int, version: int) -> None:
        doc: dict[str, Any] = {"job": self.job.job, "state": state, "round": r, "rounds": self.job.rounds,
                               "head_version": version, "pid": os.getpid(), "updated": time.time()}
        tmp = self.dir / (STATUS_FILE + ".tmp")
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, self.dir / STATUS_FILE)

