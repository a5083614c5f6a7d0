"""A combiner's synchronous round with secure aggregation (`SecureRound`): the I/O around the pure
`SecureRoundState`. The task carries the round's fresh session and its clients; then the stages follow, each
closed when every client still in the round has answered or its time is up: the keys, the shares and the share
check (each once `secure_aggregation.stage_timeout_s` pass without a new answer, and within half the round's
deadline), the masked inputs (until the round's deadline), the survivors' signatures of the survivor set and the
unmasking shares (as the keys, together within UNMASK_STAGES x stage_timeout_s; the reducer waits one
stage_timeout_s more for the sum). Every refusal is answered with its reason and audited as `fl.secagg` (an asked
client's first one by one, what a sender can repeat counted), as in a plain round.

The combiner checks the clients' signatures on their share commitments and weights with the federation CA and CRL
of its worker.yaml. A client the share check or the reveal shows to have cheated (a dealer of a bad share, a false
complainer, the sender of a wrong share at the reveal) is audited (`fl.secagg` "blamed", with what it did) and not
invited to another round of the job by this combiner, restarted or not (`secagg-blamed` in its workdir, appended
and fsynced before the round is reported). Its victims are never blamed.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
import weakref
from pathlib import Path
from typing import Mapping

from nebula.federated.actor_channels import FIRST_CLIENT_RANK
from nebula.federated.checks import Refusal
from nebula.federated.combiner.rounds import PULL_GRACE_S, ROUNDS, SyncRound
from nebula.federated.combiner.secure_state import SecureRoundState
from nebula.federated.messages import MASKED_TENSOR, PullUpdate, TrainTask
from nebula.federated.secagg import UNMASK_STAGES, MaskedInput, Verifier, load_verifier, word_bits_for_codec
from nebula.messaging import Malformed, Message, Peer
from nebula.messaging.protocol import encode_parts

__all__ = ["SecureRound"]

log = logging.getLogger(__name__)
# per combiner object: the clients blamed in this job (client -> what it did), and its certificate verifier
_BLAMED: "weakref.WeakKeyDictionary[object, dict[str, str]]" = weakref.WeakKeyDictionary()
_VERIFIERS: "weakref.WeakKeyDictionary[object, Verifier]" = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


BLAMED_FILE = "secagg-blamed"  # in the combiner's workdir: job, client and reason per line, fsynced


def blamed_clients(comb: object) -> dict[str, str]:
    """The clients combiner `comb` found cheating in this job (client -> what it did): not invited again. Read back
    from its workdir's journal the first time, so a restarted combiner keeps refusing them."""
    with _LOCK:
        hit = _BLAMED.get(comb)
        if hit is None:
            hit = _BLAMED[comb] = _read_blamed(Path(comb.workdir) / BLAMED_FILE, comb.job.job)
        return hit


def _read_blamed(path: Path, job: str) -> dict[str, str]:
    out: dict[str, str] = {}
    if path.exists():
        for line in path.read_text(errors="replace").splitlines():
            parts = line.split("\t", 2)
            if len(parts) == 3 and parts[0] == job:
                out.setdefault(parts[1], parts[2])
    return out


def _remember_blamed(comb: object, who: str, what: str) -> None:
    """Append `who` to the journal (fsynced) and to the combiner's set: blamed for the rest of the job."""
    path = Path(comb.workdir) / BLAMED_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    clean = " ".join(what.split())[:500]  # one line: tabs and newlines of a reason never split a record
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{comb.job.job}\t{who}\t{clean}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    blamed_clients(comb).setdefault(who, what)


def combiner_verifier(comb) -> Verifier:
    """The verifier of the clients' signatures at combiner `comb`: its worker.yaml's CA and CRL, each client's
    certificate named as `secure_aggregation.signers` says (ValueError naming the file and the fix)."""
    with _LOCK:
        hit = _VERIFIERS.get(comb)
    if hit is not None:
        return hit
    from nebula.config.worker import load_worker_config

    job, cfg = comb.job, comb.job.secure_aggregation
    cl = job.cluster(comb.cluster)
    worker = load_worker_config(cl.worker)
    kit = Path(cl.worker).resolve().parent
    ca, crl = (worker.tls.ca, worker.tls.crl) if worker.tls is not None else (kit / "ca.pem", kit / "crl.pem")
    hit = load_verifier(ca, crl, worker.federation, lambda c: cfg.signer_name(c, FIRST_CLIENT_RANK))
    with _LOCK:
        _VERIFIERS[comb] = hit
    return hit


@ROUNDS.register("secure")
class SecureRound(SyncRound):
    """One round at a combiner whose clients' updates it learns only the sum of."""

    clear_updates = False  # masked words only: no change to measure, nothing to clip

    def make_state(self, **kw) -> SecureRoundState:
        job = self.c.job
        banned = blamed_clients(self.c)
        left = [p for p in kw.pop("asked") if str(p) not in banned]
        if len(left) < len(self.cmd.clients):
            log.warning("combiner %s: round %d leaves out %d client(s) found cheating earlier in the job",
                        self.c.cluster, self.cmd.round, len(self.cmd.clients) - len(left))
        try:
            verifier = combiner_verifier(self.c)
        except ValueError as exc:
            state = SecureRoundState(config=job.secure_aggregation, word_bits=word_bits_for_codec(job.update_codec),
                                     claimed={}, asked=left, **kw)
            state.server, state.abandoned = None, str(exc)
            return state
        return SecureRoundState(config=job.secure_aggregation, word_bits=word_bits_for_codec(job.update_codec),
                                claimed={str(p): n for p, n in self.c.roster.items()}, verifier=verifier,
                                asked=left, **kw)

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
        for close in (st.close_keys, st.close_shares, st.close_check):
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
        until = time.monotonic() + UNMASK_STAGES * cfg.stage_timeout_s
        command = self.pump_stage(until, cfg.stage_timeout_s)
        if command is not None:
            return command
        self._closing(t0)
        self.send_stage(st.close_consistency())
        command = self.pump_stage(until, cfg.stage_timeout_s)
        self._closing(t0)
        return command

    def _closing(self, t0: float) -> None:
        s = self.state.server
        log.info("combiner %s: round %d: %s stage closed after %.2f s (keys %d, shares %d, checked %d, masked %d, "
                 "signed %d, unmasking %d of %d clients)", self.c.cluster, self.state.round, s.stage,
                 time.monotonic() - t0, len(s.keys), len(s.shared), len(s.checked), len(s.masked), len(s.signatures),
                 len(s.responded), len(s.params.clients))

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

    def send_stage(self, messages: Mapping[str, Message]) -> None:
        """Each client's answer at the end of a stage, naming its process; its parts (the header, and a raw part
        where it has one) are encoded once, for the count and the wire."""
        for who, msg in messages.items():
            peer = Peer.parse(who)
            parts = encode_parts(dataclasses.replace(msg, to=self.c.nonces.get(peer)))
            self.state.bytes_out += sum(len(p) for p in parts)
            self.c.mb.send_parts(peer, parts, lane="control")

    def on_secure(self, peer: Peer, msg: Message, parts: list | None = None) -> None:
        """A client's stage message: taken, or refused with its reason."""
        who, st = str(peer), self.state
        grant = self.c.grant_refusal()
        if grant is not None:
            return self.refuse(peer, msg, Refusal("grant", grant))
        if isinstance(msg, MaskedInput) or (isinstance(msg, Malformed) and msg.claimed == MaskedInput.TYPE):
            return self.on_masked(peer, msg, parts)
        if not isinstance(msg, Malformed):
            st.bytes_in += sum(len(p) for p in encode_parts(msg))
        why = st.take(who, msg)
        if why is not None:
            self.refuse(peer, msg, why)

    def on_masked(self, peer: Peer, msg: MaskedInput | Malformed, parts: list | None) -> None:
        """A masked update: its header checked, its words pulled (unless pushed) and added to the sum."""
        who, st, mb = str(peer), self.state, self.c.mb
        if not isinstance(msg, Malformed):
            st.bytes_in += len(encode_parts(msg)[0])
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
        st = self.state
        if st.abandoned is None and st.server is not None and st.server.stage == "unmask":
            st.sum()  # the reveal's findings come in with the sum: recorded before the round is reported
        st.note_blamed()  # refused, not missing: the controller may ask them again, this combiner does not
        super().report()
        detail = {"round": st.round, "survivors": sorted(st.accepted), "reason": st.abandoned}
        if st.server is not None:
            detail["dropped"] = sorted(st.server.active - st.server.masked)
            detail["excluded"] = sorted(st.server.excluded)
        self.c.audit.record("fl.secagg", str(st.round), "abandoned" if st.abandoned else "summed", detail)
        blamed, disputes = st.findings()
        banned = blamed_clients(self.c)
        for who, what in sorted(blamed.items()):
            log.warning("combiner %s: round %d: client %s blamed, not invited again in this job: %s", self.c.cluster,
                        st.round, who, what)
            self.c.audit.record("fl.secagg", who, "blamed", {"round": st.round, "reason": what[:500]})
            if who not in banned:
                _remember_blamed(self.c, who, what)
        for line in disputes:
            log.warning("combiner %s: round %d: %s", self.c.cluster, st.round, line)
            self.c.audit.record("fl.secagg", str(st.round), "disputed", {"round": st.round, "reason": line[:500]})
