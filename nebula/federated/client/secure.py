"""A client's part of a round with secure aggregation (`train_secure`; `SecureTraining`, how a client of a job with
`secure_aggregation` answers its tasks). (Its combiner's answers are waited for by
`nebula.federated.client.answers.Answers`, as every task's; what is done to its change before it is masked:
`nebula.federated.privacy.release`.)

What a privacy-minded client does whatever its combiner asks: it runs the protocol its own job file names (a task
without a session, in a job with `secure_aggregation`, gets nothing in the clear); it derives every parameter of the
round but the session and the list of clients from that file (so no combiner can lower the threshold or the
degree, or shrink the cohort below `min_clients`), and takes only its own cluster's clients as the cohort; it signs
its keys, its share commitments, its weight and the survivor set with its own certificate (`secagg.vouch`,
credentials from `secure_aggregation.signers`, required), takes a neighbour's keys and commitments only under that
neighbour's certificate, and checks every share it is dealt (`secagg.vss`), complaining about a bad one with the
key of that one share; it reveals shares once a
round and once a model, remembered in `<controller.dir>/clients/<cluster>-<index>/secagg-revealed` (fsynced before
a share leaves); every refusal is audited in that directory's audit.log (`fl.secagg`). It masks its change from the
round's model, clipped and noised first under `differential_privacy`, and sends no evaluation metrics then (they
would fall outside what the accountant counts).
"""
from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from nebula.federated.actor_channels import FIRST_CLIENT_RANK
from nebula.federated.client.answers import Answers
from nebula.federated.client.api import Client
from nebula.federated.config import FederatedJob
from nebula.federated.messages import MASKED_TENSOR, PullUpdate, TrainTask
from nebula.federated.privacy import AsTrained, Privatize
from nebula.federated.secagg import (KeyRoster, MemoryJournal, SecAggClient, SecAggRefused, ShareDelivery,
                                     ShareVerdict, Signer, SurvivorSet, UnmaskRequest, Verifier, flatten, load_signer,
                                     load_verifier, model_digest, word_bits_for_codec)
from nebula.federated.transport import ActorMessenger
from nebula.messaging import Malformed, Peer, fits_inline, manifest

__all__ = ["train_secure", "SecureTraining", "FileJournal", "SecureIdentity", "secure_identity", "check_cohort"]

log = logging.getLogger(__name__)


class FileJournal(MemoryJournal):
    """A client's journal of revealed rounds and models, one line each in `path`, fsynced before shares leave, so a
    restarted client still refuses a round or a model it answered."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            for line in path.read_text().splitlines():
                r, _, m = line.partition(" ")
                if r.lstrip("-").isdigit() and len(m) == 64:
                    self.rounds.add(int(r))
                    self.models.add(bytes.fromhex(m))

    def record(self, round_: int, model: bytes) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, f"{round_} {model.hex()}\n".encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        super().record(round_, model)


@dataclasses.dataclass(frozen=True, slots=True)
class SecureIdentity:
    """What a client of a secure job holds across rounds: its signer, the verifier of its neighbours, its journal
    and its audit log."""

    signer: Signer
    verifier: Verifier
    journal: FileJournal
    audit: Any  # nebula.federated._actor.ActorAudit


_IDENTITIES: dict[tuple[str, str], SecureIdentity] = {}
_IDENTITIES_LOCK = threading.Lock()


def secure_identity(job: FederatedJob, me: str) -> SecureIdentity:
    """The SecureIdentity of client `me` ("cluster/rank") of `job`, loaded once a process (ValueError naming the
    file and the fix when a credential cannot be read)."""
    with _IDENTITIES_LOCK:
        hit = _IDENTITIES.get((job.job, me))
        if hit is not None:
            return hit
        from nebula.config.worker import load_worker_config
        from nebula.federated._actor import ActorAudit

        cluster, rank = me.split("/")
        cl, cfg = job.cluster(cluster), job.secure_aggregation
        worker = load_worker_config(cl.worker)
        kit = Path(cl.worker).resolve().parent
        if not cfg.signers:  # the job file refuses this too: the cluster's shared certificate is its combiner's
            raise ValueError(cfg.SIGNERS_REQUIRED)
        stem = kit / cfg.signers.format(cluster=cluster, index=int(rank) - FIRST_CLIENT_RANK)
        signer = load_signer(stem.with_name(stem.name + ".pem"), stem.with_name(stem.name + ".key"))
        ca, crl = (worker.tls.ca, worker.tls.crl) if worker.tls is not None else (kit / "ca.pem", kit / "crl.pem")
        verifier = load_verifier(ca, crl, worker.federation, lambda c: cfg.signer_name(c, FIRST_CLIENT_RANK))
        d = Path(job.controller.dir) / "clients" / f"{cluster}-{int(rank) - FIRST_CLIENT_RANK}"
        hit = SecureIdentity(signer, verifier, FileJournal(d / "secagg-revealed"),
                             ActorAudit(d, cl.worker, "client", cluster, int(rank)))
        _IDENTITIES[(job.job, me)] = hit
        return hit


def check_cohort(job: FederatedJob, me: str, cohort: tuple[str, ...]) -> None:
    """SecAggRefused unless every client of `cohort` is a client of this one's cluster, listed once."""
    cluster = me.split("/")[0]
    known = {f"{cluster}/{FIRST_CLIENT_RANK + i}" for i in range(job.cluster(cluster).num_clients)}
    strangers = sorted(set(cohort) - known)
    if strangers or len(set(cohort)) != len(cohort) or me not in cohort:
        raise SecAggRefused(f"the round's cohort names {strangers[:3] or 'a client twice or not this one'}; a "
                            f"round at this combiner takes only the clients of cluster {cluster}, each once")


def _audit(ident: SecureIdentity | None, round_: int, reason: str) -> None:
    if ident is not None:
        ident.audit.record("fl.secagg", str(round_), "refused", {"reason": reason[:500]})


class _Ended(Exception):
    """A stage's answer did not come (the round ended, or another task came meanwhile): `result` is what
    `train_secure` returns then."""

    def __init__(self, status: str, got: Any) -> None:
        super().__init__(status)
        self.result = (False, got if status == "pending" else None)


def _answer(ans: Answers, want: type, end: float, what: str) -> Any:
    """`Answers.wait` for one stage's answer: (message, parts after it); _Ended when none came; SecAggRefused for an
    answer addressed to this process that does not decode (a raw part cut short, say): the combiner misbehaves, the
    round is sat out."""
    status, got = ans.wait((want, Malformed), end, what)
    if status != "ok":
        raise _Ended(status, got)
    if isinstance(got[0], Malformed):
        raise SecAggRefused(f"the combiner's answer to the {what} does not decode: {got[0].reason}")
    return got


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class SecureTraining:
    """A client of a job with secure aggregation: each task answered through the protocol, its change masked after
    `release` (differential privacy's clip and noise, or as trained)."""

    release: AsTrained | Privatize

    def answer(self, mb: ActorMessenger, peer: Peer, task: TrainTask, client: Client, job: FederatedJob, me: str,
               parts: list | None, nonce: str) -> tuple[bool, Any]:
        """Run one task of combiner `peer`: (took part?, a message that came meanwhile, to be served next)."""
        return train_secure(mb, peer, task, client, job, me, parts, nonce, self.release)


def train_secure(mb: ActorMessenger, peer: Peer, task: TrainTask, client: Client, job: FederatedJob, me: str,
                 parts: list | None, nonce: str, release: AsTrained | Privatize = AsTrained()) -> tuple[bool, Any]:
    """Run one task under secure aggregation: keys, shares, train, mask, unmask (`release`: what is done to the
    change before it is masked). (Took part?, a message that came meanwhile and is to be served next.)"""
    params = mb.recv_model(peer, task, job.deadline_s, inline=parts)
    cfg = job.secure_aggregation
    ident = None
    try:
        ident = secure_identity(job, me)
        if task.session is None:
            raise SecAggRefused("the combiner asks for an update in the clear, but the job file sets "
                                "secure_aggregation; nothing is sent")
        check_cohort(job, me, task.cohort)
        length = sum(int(v.size) for v in params.values())
        sa = SecAggClient(me, cfg.round_params(task.round, task.cohort, length, task.session,
                                               word_bits_for_codec(job.update_codec), version=task.version,
                                               model=model_digest(params)),
                          ident.signer, ident.verifier, ident.journal)
    except (ValueError, SecAggRefused) as exc:
        log.warning("%s: round %s not joined: %s", me, task.round, exc)
        _audit(ident, task.round, f"round not joined: {exc}")
        return False, None
    ans, r = Answers(mb, peer, job, me, nonce), task.round
    end = time.monotonic() + task.deadline_s + cfg.stage_timeout_s + 10
    try:
        mb.send(peer, sa.advertise())
        got = _answer(ans, KeyRoster, end, f"keys of round {r}")
        mb.send(peer, sa.share_keys(got[0]))
        got = _answer(ans, ShareDelivery, end, f"shares of round {r}")
        if got[1]:  # (its commitments came in its raw part: nothing else follows a delivery)
            raise SecAggRefused(f"sa_delivery came with {len(got[1])} part(s) more than its raw part; the combiner "
                                "relays malformed deliveries")
        checked = sa.check_shares(got[0])
        for x in checked.complaints:
            log.warning("%s: round %s: the share of %s fails its commitments; complaint sent", me, r, x.dealer)
            ident.audit.record("fl.secagg", str(r), "complained", {"dealer": x.dealer, "reason": "its share fails "
                                                                   "the dealer's commitments"})
        mb.send(peer, checked)
        got = _answer(ans, ShareVerdict, end, f"share check of round {r}")
        verdict = got[0]
        config = dict(task.config)
        metrics = release.evaluation(client.evaluate, params, config)  # (none under differential privacy)
        weights, n, fm = client.fit(params, config)
        names = list(params)
        change = release.change(flatten(weights, names) - flatten(params, names), sa.params.threshold)
        m = sa.mask(verdict, change, n)
        masked = {MASKED_TENSOR: m.words}
        head = dataclasses.replace(m, words=None, job=job.job, metrics=release.metrics(metrics, fm))
        if masked[MASKED_TENSOR].nbytes <= task.push_bytes and fits_inline(manifest(masked), job.piece_bytes):
            mb.send_model(peer, dataclasses.replace(head, pushed=True), masked, inline=True)
        else:
            mb.send(peer, mb.model_header(head, masked))
            got = _answer(ans, PullUpdate, end, f"masked update of round {r}")
            mb.send_pieces(peer, masked)
        got = _answer(ans, SurvivorSet, end, f"masked update of round {r}")
        mb.send(peer, sa.sign_survivors(got[0]))
        got = _answer(ans, UnmaskRequest, end, f"survivor set of round {r}")
        mb.send(peer, sa.unmask(got[0]))
        return True, None
    except _Ended as ended:
        return ended.result
    except (SecAggRefused, KeyError, ValueError) as exc:
        log.warning("%s: left secure round %s: %s", me, r, exc)
        _audit(ident, r, str(exc))
        return False, None
