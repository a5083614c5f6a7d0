"""What the controller is and does around the rounds: its run identity, the combiners' status (participation,
grants, witnesses), the initial model, the assignment of clients to combiners, the end of a run.

Every message to a combiner names the run (`run`: this controller start's epoch and a random session) and its
commands name the combiner process (`to`: the nonce of its latest status answer), so no command of an earlier run
reaches a later one; answers of another run are dropped. Job grants hold across the federation: each combiner
reports whether its cluster's account home grants the job (`grant` in its status answer), and no client of a
cluster whose combiner refused, or has not said, is assigned to any combiner. The combiners' signed audit
checkpoints that come with their answers are kept as witnesses (`nebula.federated.controller.witness`).
"""
from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Iterator

from nebula.federated._actor import ActorAudit, check_terminated
from nebula.federated.actor_channels import COMBINER_RANK
from nebula.federated.config import FederatedJob
from nebula.federated.controller.capabilities import (NoRoundPrivacy, PlainRounds, SecureRounds, privacy_policy,
                                                      secure_policy)
from nebula.federated.controller.privacy import RoundPrivacy
from nebula.federated.controller.trail import ModelTrail
from nebula.federated.controller.witness import CombinerWitness
from nebula.federated.initial import fetch_initial, load_initial_model
from nebula.federated.messages import Bye, StatusAnswer, StatusRequest, Stop
from nebula.federated.runfiles import RunFiles
from nebula.federated.strategy import get_strategy
from nebula.federated.transport import ActorMessenger
from nebula.messaging import Malformed, Message, Peer

__all__ = ["ControllerBase", "STATUS_WAIT_S", "BYE_WAIT_S"]

log = logging.getLogger(__name__)
STATUS_WAIT_S = 2.0  # a combiner that does not answer a status request this fast sits the round out
BYE_WAIT_S = 5.0  # how long the end of a run waits for the combiners' last checkpoints


class ControllerBase:
    """The controller's state and its dealings with the combiners outside a round's reduce
    (`nebula.federated.controller.Controller` runs the rounds)."""

    def __init__(self, job: FederatedJob, workdir: str | Path | None = None) -> None:
        self.job = job
        self.dir = Path(workdir or job.controller.dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.files = RunFiles(self.dir)
        self.files.clear_stop()  # a stop asked of an earlier run is not this run's
        self.strategy = get_strategy(job.strategy.name, job.strategy.options)
        self.combiners = [Peer(c.id, COMBINER_RANK) for c in job.clusters]
        self.mb: ActorMessenger | None = None
        self.trail: ModelTrail | None = None
        self.audit: ActorAudit | None = None
        self.witness: CombinerWitness | None = None
        self._seq = 0
        self._asked = False  # a status request is out whose answers no `status()` has taken yet (`ask_status`)
        self._started = False
        self.run_id = ""  # "<epoch>.<session>": what every message of this run names (set by run())
        self.wan_bytes: list[int] = []  # bytes this controller sent to other clusters, per round
        self.accepted_by: dict[Peer, set[Peer]] = {}  # client -> the combiners that have it in their roster
        self.nonces: dict[Peer, str] = {}  # combiner -> the nonce of its process, from its latest status answer
        # cluster -> why its account home refuses the job (None: granted); only clusters with an accounts_home
        self.grant_of: dict[str, str | None] = {}
        self.guarded = {c.id for c in job.clusters if c.accounts_home}
        # what the job's secure_aggregation and differential_privacy make of a round (controller.capabilities; a
        # no-op when off). Differential privacy resumes its accountant from the trail: run() sets it once the trail
        # is open, and until then the controller draws and reports as without it (no round is drawn before then).
        self.secure: PlainRounds | SecureRounds = secure_policy(job)
        self.privacy: NoRoundPrivacy | RoundPrivacy = privacy_policy(job, None)

    def _next_epoch(self) -> int:
        """This start's epoch: one more than the last start's (kept beside the trail)."""
        f = self.dir / "epoch"
        epoch = int(f.read_text()) + 1 if f.exists() else 0
        f.write_text(str(epoch))
        return epoch

    def finish(self) -> None:
        """Stop the combiners of this run (a last status learns the nonce of any that came late) and keep their
        last audit checkpoints."""
        live, _ = self.status()
        for c in live:
            self.mb.send(c, Stop(run=self.run_id, to=self.nonces[c]))
        waiting, deadline = set(live), time.monotonic() + BYE_WAIT_S
        while waiting and time.monotonic() < deadline:
            got = self.mb.poll(sorted(waiting), deadline - time.monotonic())
            if got is None:
                break
            peer, msg, _ = got
            if isinstance(msg, Bye) and msg.run == self.run_id:
                waiting.discard(peer)
                self.witness.receive(peer.cluster, msg.checkpoint, final=True)

    # participation
    def ask_status(self) -> None:
        """Ask every combiner for its status; the next `status()` takes these answers instead of asking again (a
        round asks for the next one's as soon as its partials are in: the answers come while it commits)."""
        self._seq += 1
        for c in self.combiners:
            self.mb.send(c, StatusRequest(seq=self._seq, run=self.run_id))
        self._asked = True

    def status(self) -> tuple[list[Peer], dict[Peer, int]]:
        """(combiners that answered, the union of their rosters: client -> examples), to the request `ask_status`
        sent last if no answers were taken since, else to a new one."""
        if not self._asked:
            self.ask_status()
        self._asked = False
        live, roster, missed = [], {}, set()
        self.accepted_by = {}
        deadline = time.monotonic() + STATUS_WAIT_S
        waiting = set(self.combiners)
        for peer, msg in self.answers(waiting, deadline):
            if not isinstance(msg, StatusAnswer) or msg.seq != self._seq or msg.run != self.run_id:
                self.discard(peer, msg)
                continue
            waiting.discard(peer)
            try:
                got_roster = {Peer.parse(c): int(n) for c, n in msg.roster.items()}
            except (TypeError, ValueError) as exc:
                log.warning("controller: malformed status answer from %s (%s); it sits this round out", peer, exc)
                continue
            missed.update(msg.missed)
            live.append(peer)
            self.nonces[peer] = msg.nonce[:64]
            self._grant(peer.cluster, msg.grant)
            self.witness.receive(peer.cluster, msg.checkpoint)
            for c, n in got_roster.items():
                roster[c] = n
                self.accepted_by.setdefault(c, set()).add(peer)
        # a client that let its combiner down is not asked again until that combiner hears from it
        return sorted(live), {c: n for c, n in roster.items() if str(c) not in missed}

    def answers(self, waiting: set[Peer], deadline: float) -> Iterator[tuple[Peer, Message]]:
        """The messages of the combiners in `waiting` (a set the caller shrinks as they answer) until none is left or
        `deadline` (a monotonic time) passes."""
        while waiting and time.monotonic() < deadline:
            check_terminated()
            got = self.mb.poll(sorted(waiting), min(1.0, deadline - time.monotonic()))
            if got is not None:
                yield got[0], got[1]

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

    def discard(self, peer: Peer, msg: Message) -> None:
        """Drop a message of an earlier round or run (consuming the model pieces that follow it); a combiner's Bye
        of this run (it was stopped by SIGTERM) is its closing checkpoint, kept as at the end of a run."""
        if isinstance(msg, Bye) and msg.run == self.run_id:
            log.warning("controller: combiner %s stopped (its closing audit checkpoint is kept)", peer)
            self.witness.receive(peer.cluster, msg.checkpoint, final=True)
            return
        what = msg.claimed if isinstance(msg, Malformed) else msg.TYPE
        log.info("controller: dropping a late %s from %s (round %s)", str(what)[:32], peer,
                 str(getattr(msg, "round", None))[:32])
        try:
            self.mb.skip_pieces(peer, msg, self.job.deadline_s)
        except (TimeoutError, ValueError) as exc:
            log.warning("controller: pieces of a dropped %s from %s: %s", str(what)[:32], peer, exc)

    def wait_roster(self, need: int, want: int | None = None) -> tuple[list[Peer], dict[Peer, int]]:
        """Live combiners and roster once `need` clients are connected; up to `startup_timeout_s` for `want`."""
        t0 = time.monotonic()
        deadline = t0 + self.job.startup_timeout_s
        while True:
            live, roster = self.status()
            if live and len(roster) >= (want or need) and (not want or len(live) == len(self.combiners)):
                return live, roster
            if live and len(roster) >= need and want and time.monotonic() > t0 + self.job.startup_timeout_s / 2:
                return live, roster
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(roster)} clients reached {len(live)} combiners within "
                                   f"{self.job.startup_timeout_s} s, {need} needed; start more clients or lower "
                                   "validity.min_updates")
            time.sleep(0.5)

    def initialise(self) -> int:
        """An empty trail: the job's initial_model file, or the model most of the asked clients agree on
        (nebula.federated.initial), committed as version 1."""
        job = self.job
        if job.initial_model is not None:
            weights, who, clients = load_initial_model(job), f"file {job.initial_model}", []
        else:
            # as many clients as will be asked, or as round 1 waits for
            self.wait_roster(1, min(job.initial_clients, job.clients_per_round or sum(c.num_clients for c in
                                                                                      job.clusters)))

            def audit(client: str, outcome: str, detail: dict) -> None:
                self.audit.record("fl.initial", client, outcome, detail)

            weights, who = fetch_initial(self.mb, job, self.run_id, lambda: self.status()[1], audit,
                                         self._client_refusal)
            clients = [who]
        return self.trail.commit(weights, parent=None, round=0, strategy=self.strategy.describe(), clients=clients,
                                 metrics={"initialised_by": who})

    def assign(self, live: list[Peer], roster: dict[Peer, int], r: int) -> dict[Peer, list[Peer]]:
        # under differential privacy the sampler the accountant analyses, unpredictable (controller.privacy);
        # otherwise from the job's seed
        chosen = self.privacy.sample(sorted(roster), r)
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

    def write_status(self, state: str, r: int, version: int, reason: str | None = None) -> None:
        doc = {"job": self.job.job, "state": state, "round": r, "rounds": self.job.rounds, "head_version": version,
               "pid": os.getpid()}
        if reason is not None:
            doc["reason"] = reason
        doc.update(self.privacy.detail())  # (differential privacy: where the budget stands)
        self.files.write_status(doc)

    def stop_requested(self) -> bool:
        """Whether `nebula fl stop` asked this run to end."""
        return self.files.stop_asked()
