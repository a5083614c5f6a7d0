"""A combiner's synchronous round with secure aggregation (`SecureRound`): the I/O around the pure
`SecureRoundState`. The task carries the round's fresh session and its clients; then the stages follow, each
closed when every client still in the round has answered or its time is up: the keys and the shares (each once
`secure_aggregation.stage_timeout_s` pass without a new answer, and within half the round's deadline), the masked
inputs (until the round's deadline) and the unmasking shares (as the keys, within UNMASK_STAGES x stage_timeout_s;
the reducer waits one stage_timeout_s more for the sum). Every refusal is answered with its reason and audited
as `fl.secagg` (an asked client's first one by one, what a sender can repeat counted), as in a plain round.
"""
from __future__ import annotations

import dataclasses
import logging
import time

from nebula.federated.checks import Refusal
from nebula.federated.combiner_rounds import PULL_GRACE_S, SyncRound
from nebula.federated.messages import MASKED_TENSOR, MaskedUpdate, PullUpdate, TrainTask
from nebula.federated.protocol import Malformed, Message, to_json
from nebula.federated.secagg import word_bits_for_codec
from nebula.federated.secure_state import SecureRoundState
from nebula.federated.transport import Peer

__all__ = ["SecureRound", "UNMASK_STAGES"]

log = logging.getLogger(__name__)
UNMASK_STAGES = 2  # the unmask stage lasts at most this many stage_timeout_s


class SecureRound(SyncRound):
    """One round at a combiner whose clients' updates it learns only the sum of."""

    def make_state(self, **kw) -> SecureRoundState:
        job = self.c.job
        return SecureRoundState(config=job.secure_aggregation, word_bits=word_bits_for_codec(job.update_codec),
                                claimed={str(p): n for p, n in self.c.roster.items()}, **kw)

    def task(self) -> TrainTask:
        p = self.state.params
        return dataclasses.replace(super().task(), session=p.session, cohort=p.clients)

    def fan_out(self) -> None:
        if self.state.server is None:  # too few clients to hide one: nobody is asked to train
            log.warning("combiner %s: round %d not run: %s", self.c.cluster, self.cmd.round, self.state.abandoned)
            self.weights = None
            return
        super().fan_out()

    def collect(self) -> Message | None:
        st, cfg = self.state, self.c.job.secure_aggregation
        if st.server is None:
            return None
        t0 = time.monotonic()
        for close in (st.close_keys, st.close_shares):
            command = self.pump_stage(min(self.deadline, time.monotonic() + self.cmd.deadline_s / 2),
                                      cfg.stage_timeout_s)
            if command is not None:
                return command
            self._closing(t0)
            self.send_stage(close())
        command = self.pump(self.deadline)
        if command is not None:
            return command
        self._closing(t0)
        self.send_stage(st.close_masked())
        command = self.pump_stage(time.monotonic() + UNMASK_STAGES * cfg.stage_timeout_s, cfg.stage_timeout_s)
        self._closing(t0)
        return command

    def _closing(self, t0: float) -> None:
        s = self.state.server
        log.info("combiner %s: round %d: %s stage closed after %.2f s (keys %d, shares %d, masked %d, unmasking %d "
                 "of %d clients)", self.c.cluster, self.state.round, s.stage, time.monotonic() - t0, len(s.keys),
                 len(s.shared), len(s.masked), len(s.responded), len(s.params.clients))

    def pump_stage(self, until: float, quiet_s: float) -> Message | None:
        """Serve a stage until every client still in it has answered, or `quiet_s` pass without a new answer (a
        large model to many clients takes a while to go out: the stage waits while answers keep coming), or
        `until`; a command of the controller that came meanwhile, or None."""
        st = self.state
        while True:
            before = st.answers()
            command = self.pump(min(until, time.monotonic() + quiet_s))
            if command is not None or not st.waiting() or time.monotonic() >= until or st.answers() == before:
                return command

    def send_stage(self, messages: dict[str, Message]) -> None:
        """Each client's answer at the end of a stage, naming its process."""
        for who, msg in messages.items():
            peer = Peer.parse(who)
            msg = dataclasses.replace(msg, to=self.c.nonces.get(peer))
            self.state.bytes_out += len(to_json(msg))
            self.c.mb.send(peer, msg)

    def on_secure(self, peer: Peer, msg: Message, parts: list | None = None) -> None:
        """A client's stage message: taken, or refused with its reason."""
        who, st = str(peer), self.state
        grant = self.c.grant_refusal()
        if grant is not None:
            return self.refuse(peer, msg, Refusal("grant", grant))
        if isinstance(msg, MaskedUpdate) or (isinstance(msg, Malformed) and msg.claimed == MaskedUpdate.TYPE):
            return self.on_masked(peer, msg, parts)
        if not isinstance(msg, Malformed):
            st.bytes_in += len(to_json(msg))
        why = st.take(who, msg)
        if why is not None:
            self.refuse(peer, msg, why)

    def on_masked(self, peer: Peer, msg: MaskedUpdate | Malformed, parts: list | None) -> None:
        """A masked update: its header checked, its words pulled (unless pushed) and added to the sum."""
        who, st, mb = str(peer), self.state, self.c.mb
        if not isinstance(msg, Malformed):
            st.bytes_in += len(to_json(msg))
        why = st.check_masked(who, msg, job=self.c.job.job)
        if why is not None:
            return self.refuse(peer, msg, why)
        if not msg.pushed:
            self.c.to_client(peer, PullUpdate(round=st.round))
        try:
            got = mb.recv_model(peer, msg, max(0.5, self.deadline - time.monotonic()) + PULL_GRACE_S, inline=parts)
            words = got[MASKED_TENSOR]
            why = st.fold_masked(who, msg, words, nbytes=words.nbytes)
        except (TimeoutError, ValueError) as exc:
            why = Refusal("secagg", f"incomplete masked update: {exc}")
        if why is not None:
            return self.refuse(peer, msg, why)
        self.c.audit.record("fl.update", who, "accepted", {"round": st.round, "masked": True})

    def refuse(self, peer: Peer, msg: Message, why: Refusal) -> None:
        first = self.state.refuse(str(peer), msg, why)
        self.c.refuse(peer, msg, why, counted=not first, action="fl.secagg")

    def report(self) -> None:
        super().report()
        st = self.state
        detail = {"round": st.round, "survivors": sorted(st.accepted), "reason": st.abandoned}
        if st.server is not None:
            detail["dropped"] = sorted(set(st.server.shared) - st.server.masked)
        self.c.audit.record("fl.secagg", str(st.round), "abandoned" if st.abandoned else "summed", detail)
