"""Combiner: one per cluster, behind its switch. It takes the round's global model once over the WAN, fans it out
to its clients inside the cluster, checks and streams their updates into one partial model (about one model's
worth of memory for streaming strategies), and hands the partial with its example count to the reducer.

How it checks updates, counts refusals, and knows its run: `nebula.federated.combiner.base` (the rules:
`nebula.federated.checks`); a round's state: `nebula.federated.combiner.round_state`, its I/O:
`nebula.federated.combiner.rounds` (with secure aggregation: `.secure_state`, `.secure`), chosen by the job's
`nebula.federated.combiner.capabilities`; the messages: `nebula.federated.messages`.
"""
from __future__ import annotations

import logging

from nebula.channel import Endpoint
from nebula.federated._actor import ActorAudit, JobGrants, Terminated, check_terminated
from nebula.federated.actor_channels import COMBINER_RANK
from nebula.federated.combiner.base import ANY_START, CombinerBase, client_peers
from nebula.federated.combiner.rounds import ROUNDS, serve_async
from nebula.federated.intake import spool_dir
from nebula.federated.messages import StartAsync, StartRound, Stop
from nebula.federated.transport import MODEL_SLOTS, ActorMessenger

__all__ = ["Combiner", "client_peers", "ANY_START"]

log = logging.getLogger(__name__)


class Combiner(CombinerBase):
    """The combiner of `cluster` for `job`; `run()` serves until the controller says stop."""

    def run(self) -> None:
        """Connect to the switch and serve rounds until told to stop."""
        cl = self.job.cluster(self.cluster)
        ep = Endpoint.connect(cl.worker, job=self.job.job, rank=COMBINER_RANK, timeout_s=self.job.startup_timeout_s,
                              share_slots=MODEL_SLOTS)
        self.mb = ActorMessenger(ep, self.job.piece_bytes, self.controller)
        self.mb.watch()  # look only at the channels that got something: a poll costs the same for 1000 clients
        self.listen = frozenset([*self.clients, self.controller])
        self.audit = ActorAudit(self.workdir, cl.worker, "combiner", self.cluster, COMBINER_RANK)
        self.spool = spool_dir(self.workdir)
        self.grants = JobGrants(cl.accounts_home) if cl.accounts_home else None
        self.audit.record("fl.combiner", self.cluster, "started", {"job": self.job.job, "nonce": self.nonce})
        log.info("combiner %s/%d ready", self.cluster, COMBINER_RANK)
        try:
            command = None  # a controller's command that ended a round, served next
            while True:
                check_terminated()
                got = (self.controller, command, None) if command else self.mb.poll(self.listen, 1.0)
                command = None
                self.flush_if_due()
                if got is None:
                    continue
                cmd = self.take(got)
                if isinstance(cmd, Stop):
                    self.stop(cmd)
                    return
                if isinstance(cmd, StartRound):
                    command = ROUNDS.get(self.round_kind).serve(self, cmd)  # (combiner.capabilities.round_kind)
                elif isinstance(cmd, StartAsync) and serve_async(self, cmd) == "stop":
                    return
        except Terminated:
            self.terminated()
        finally:
            self.tally.flush(self.audit)
            self.audit.close()
            ep.close(flush_s=5)
