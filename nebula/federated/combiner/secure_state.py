"""One synchronous round with secure aggregation at a combiner, as pure state: a `RoundState` whose clients' updates
are summed by a `SecAggServer` (nebula.federated.secagg) instead of a running mean, so the combiner learns only
their sum. No sockets: `nebula.federated.combiner.secure.SecureRound` does the I/O (tasks, stage messages, pulls,
audit records), and a test can drive it with messages it builds itself.

The stages: keys (`sa_keys` in, `sa_roster` out), shares (`sa_shares` in, `sa_delivery` out), share check
(`sa_check` in, `sa_verdict` out: complaints settled, the blamed left out), masked inputs (`sa_masked` in, with the
signed public weight; `sa_survivors` out), consistency (`sa_signed` in, `sa_unmask` out), reveal (`sa_reveal` in).
The round's parameters bind the model it trains (its version and `secagg.model_digest`), as each client sees it.
Each stage ends when every client still in the round has answered, or when the I/O's clock says so (`close_*`). A client refused at a stage is out of the round; its
first refusal is recorded (one per client and round), what it repeats is counted, as in a plain round. The partial
is the survivors' SecureSum as a mean change (`secagg.compose.partial_mean`) with its count as its weight, the
fixed-point bound on each value, and the clients that dropped after sharing keys. `findings()` lists, one line
each, who the share check or the reveal showed to have cheated (`blamed`: to be audited and not invited again) and
the complaints that could not be settled.
"""
from __future__ import annotations

import os
from typing import Mapping

import numpy as np

from nebula.federated.checks import Refusal
from nebula.federated.combiner.round_state import RoundState, Weights
from nebula.federated.messages import (MASKED_TENSOR, ClientUpdate, MaskedUpdate, Partial, SecureCheck,
                                       SecureDelivery, SecureKeys, SecureReveal, SecureRoster, SecureShares,
                                       SecureSigned, SecureSurvivors, SecureUnmask, SecureVerdict, delivery_parts)
from nebula.federated.secagg import (AdvertiseKeys, Complaint, DealerCommitments, EncryptedShare, MaskedInput,
                                     SecAggConfig, SecAggRefused, SecAggServer, SecureSum, ShareCheck, ShareKeys,
                                     SurvivorSignature, UnmaskResponse, Verifier, model_digest, partial_mean,
                                     unflatten)
from nebula.messaging import Malformed, Message

__all__ = ["SecureRoundState"]


class SecureRoundState(RoundState):
    """A round of `RoundState`'s arguments summed under `config` (the job's secure_aggregation) with `word_bits`
    words; `claimed`: the examples each client said it holds (its hello), reported as the partial's count;
    `verifier`: checks the clients' commitment and weight signatures (None: unchecked, for tests of the I/O)."""

    def __init__(self, *, config: SecAggConfig, word_bits: int, claimed: Mapping[str, int],
                 session: bytes | None = None, verifier: Verifier | None = None, **kw) -> None:
        digest = model_digest(kw["weights"])
        super().__init__(**kw)
        self.mean = None  # no running mean: the server's sum of words is the round's only aggregate
        self.names = [t[0] for t in self.tensors]
        self.like = {t[0]: np.empty(tuple(t[2]), np.dtype(t[1])) for t in self.tensors}
        self.claimed = dict(claimed)
        self.bytes_in = self.bytes_out = 0  # the stage messages from the clients and to them
        self.abandoned: str | None = None  # why the round cannot run or could not unmask
        self._sum: SecureSum | None = None
        self.server: SecAggServer | None = None
        length = sum(int(np.prod(t[2], dtype=np.int64)) for t in self.tensors)
        try:
            self.params = config.round_params(self.round, [str(p) for p in self.asked], length,
                                              session or os.urandom(16), word_bits, version=self.version,
                                              model=digest)
        except ValueError as exc:
            self.params, self.abandoned = None, str(exc)
            return
        self.server = SecAggServer(self.params, verifier)
        self.masked_spec = [[MASKED_TENSOR, self.params.quantizer.dtype.name, [length]]]

    # -- who the round waits for ---------------------------------------------------------------------------------
    def waiting(self) -> bool:
        """Whether a client still in the round has not answered the current stage."""
        s = self.server
        if s is None or s.stage == "done":
            return False
        out = set(s.excluded) | {r["client"] for r in self.rejected}
        want = {"advertise": set(self.params.clients) - set(s.keys), "share_keys": set(s.holders) - set(s.shared),
                "check_shares": set(s.shared) - s.checked, "mask": set(s.active) - s.masked,
                "consistency": set(s.survivors) - set(s.signatures),
                "unmask": set(s.requests) - s.responded}[s.stage]
        return bool(want - out)

    def answers(self) -> int:
        """How many stage messages the round has taken or refused so far (a stage that gains none is quiet)."""
        s = self.server
        return (len(s.keys) + len(s.shared) + len(s.checked) + len(s.masked) + len(s.signatures) + len(s.responded)
                + len(self.rejected))

    # -- stages 1, 2 and 4: small messages -----------------------------------------------------------------------
    def take(self, who: str, msg: Message) -> Refusal | None:
        """Take a key, share or reveal message of `who`; why it is refused, or None."""
        if isinstance(msg, Malformed):
            return Refusal("malformed", msg.reason)
        if self.server is None:
            return Refusal("secagg", f"round {self.round} is not run at this combiner: {self.abandoned}")
        try:
            if isinstance(msg, SecureKeys):
                self.server.receive_keys(AdvertiseKeys(who, msg.round, msg.cipher_pk, msg.mask_pk, msg.chain,
                                                       msg.signature))
            elif isinstance(msg, SecureShares):
                self.server.receive_shares(ShareKeys(who, msg.round, DealerCommitments(
                    who, msg.seed_commitments, msg.key_commitments, msg.signature), tuple(
                    EncryptedShare(who, r, c, k) for r, c, k in msg.shares)))
            elif isinstance(msg, SecureCheck):
                self.server.receive_check(ShareCheck(who, msg.round, tuple(Complaint(d, k) for d, k in msg.complaints)))
            elif isinstance(msg, SecureSigned):
                self.server.receive_signature(SurvivorSignature(who, msg.round, msg.signature))
            elif isinstance(msg, SecureReveal):
                self.server.receive_unmask(UnmaskResponse(who, msg.round, msg.seed_shares, msg.key_shares))
            else:
                return Refusal("malformed", f"a {msg.TYPE} is not a secure aggregation stage message")
        except SecAggRefused as exc:
            return self._kind(who, msg.round, str(exc))
        return None

    def _kind(self, who: str, round_: object, reason: str) -> Refusal:
        """A refusal, counted by kind: another round's or a stranger's messages ("late", "uninvited") can be
        repeated at will; a round client's refusal at a stage is "secagg" (recorded once, see `refuse`)."""
        if round_ != self.round:
            return Refusal("late", reason)
        return Refusal("secagg" if who in self.expected else "uninvited", reason)

    def refuse(self, who: str, upd: Message, why: Refusal) -> bool:
        """Note a refusal; True when it is this round client's first (recorded: it is out of the round), False when
        it is to be counted."""
        first = why.kind == "secagg" and who in self.expected and all(r["client"] != who for r in self.rejected)
        if first:
            self.seen.add(who)
            self.rejected.append({"client": who, "reason": str(why)})
            return True
        if isinstance(upd, (ClientUpdate, Malformed)):
            return super().refuse(who, upd, why)
        return False

    def check(self, who: str, upd: ClientUpdate | Malformed, *, known_version: int, grant: str | None = None
              ) -> Refusal | None:
        """A clear update in a round with secure aggregation is refused: the combiner must never see one."""
        if grant is not None:
            return Refusal("grant", grant)
        return Refusal("secagg" if who in self.expected and not isinstance(upd, Malformed) else "malformed",
                       f"round {self.round} uses secure aggregation: an update in the clear is refused unread; give "
                       "the client the job file with secure_aggregation")

    # -- closing the stages ------------------------------------------------------------------------------------------
    def close_keys(self) -> dict[str, SecureRoster]:
        """End stage 1: each client's roster of its neighbours' keys."""
        return {c: SecureRoster(round=self.round, keys=tuple((k.client, k.cipher_pk, k.mask_pk, k.chain, k.signature)
                                                             for k in r.keys))
                for c, r in self.server.rosters().items()}

    def close_shares(self) -> dict[str, tuple[SecureDelivery, bytes]]:
        """End stage 2: each client's shares, sealed for it by its neighbours, with their signed commitments (the
        header, and the commitments raw in the part after it: `messages.delivery_parts`)."""
        return {c: delivery_parts(tuple((e.sender, e.ciphertext) for e in d.shares),
                                  [(x.dealer, x.seed, x.key, x.signature) for x in d.commitments], self.round)
                for c, d in self.server.deliveries().items()}

    def close_check(self) -> dict[str, SecureVerdict]:
        """End stage 3: complaints settled; each client still in gets the list of those left out."""
        return {c: SecureVerdict(round=self.round, excluded=v.excluded) for c, v in self.server.verdicts().items()}

    def findings(self) -> tuple[dict[str, str], list[str]]:
        """(client -> what the share check or the reveal showed it did, the complaints that stayed unsettled)."""
        if self.server is None:
            return {}, []
        return dict(self.server.blamed), list(self.server.disputes)

    def close_masked(self) -> dict[str, SecureSurvivors]:
        """End stage 4: the survivor set to each survivor, to sign (none when the round must be abandoned)."""
        try:
            sets = self.server.survivor_sets()
        except SecAggRefused as exc:
            self.abandoned = str(exc)
            return {}
        return {c: SecureSurvivors(round=self.round, survivors=r.survivors) for c, r in sets.items()}

    def close_consistency(self) -> dict[str, SecureUnmask]:
        """End stage 5: ask each survivor that signed for its shares, with its holders' signatures of the set."""
        if self.abandoned is not None or self.server.stage != "consistency":
            return {}
        return {c: SecureUnmask(round=self.round, survivors=r.survivors, signatures=r.signatures)
                for c, r in self.server.unmask_requests().items()}

    # -- stage 4: the masked inputs ------------------------------------------------------------------------------
    def check_masked(self, who: str, msg: MaskedUpdate | Malformed, *, job: str) -> Refusal | None:
        """Why a masked update's header must be refused before its words are taken, or None."""
        if isinstance(msg, Malformed):
            return Refusal("malformed", msg.reason)
        if self.server is None:
            return Refusal("secagg", f"round {self.round} is not run at this combiner: {self.abandoned}")
        if msg.job != job:
            return Refusal("job", f"masked update of job {msg.job[:64]!r}, not {job!r}")
        if msg.round != self.round or msg.version != self.version:
            return Refusal("late", f"late: masked update of round {msg.round} (version {msg.version}), the round in "
                           f"progress is {self.round}; a synchronous round never sums inputs of another round")
        try:
            self.server.check_masked(who, msg.round)
        except SecAggRefused as exc:
            return self._kind(who, msg.round, str(exc))
        layout = msg.model
        if layout is None or (msg.pushed and not layout.inline):
            return Refusal("secagg", "a masked update must announce its words (pushed inline, or pulled)")
        if layout.tensors != self.masked_spec:
            return Refusal("secagg", f"masked update announces {str(layout.tensors)[:80]}, the round takes "
                                     f"{self.masked_spec}")
        return None

    def fold_masked(self, who: str, msg: MaskedUpdate, words: np.ndarray, *, nbytes: int) -> Refusal | None:
        """Add a checked masked update's words to the sum; why it is refused, or None."""
        try:
            self.server.receive_masked(MaskedInput(who, msg.round, words, msg.weight, msg.signature))
        except SecAggRefused as exc:
            return self._kind(who, msg.round, str(exc))
        self.seen.add(who)
        self.accepted.append(who)
        self.update_bytes += nbytes
        self._eval_metrics(msg.metrics)
        return None

    def sum(self) -> SecureSum | None:
        """The round's SecureSum once the reveal is over (computed once), or None (`abandoned` says why)."""
        if self._sum is None and self.abandoned is None and self.server is not None and \
                self.server.stage == "unmask":
            try:
                self._sum = self.server.result()
            except SecAggRefused as exc:
                self.abandoned = str(exc)
        return self._sum

    def note_blamed(self) -> None:
        """Record each asked client the protocol showed to cheat as refused with what it did (not as missing)."""
        for c, why in sorted(self.server.blamed.items() if self.server is not None else ()):
            if c in self.expected and c not in self.seen:
                self.seen.add(c)
                self.rejected.append({"client": c, "reason": f"secure aggregation: {why}"})

    # -- the partial -------------------------------------------------------------------------------------------------
    def partial(self, *, run: str | None, counted: list[dict], checkpoint: str | None, delta: bool
                ) -> tuple[Partial, Weights | None]:
        """The survivors' mean change with their count as its weight (no model when the round was abandoned)."""
        weights, result = None, self.sum()
        count, bound = None, 0.0
        if result is not None and result.num_examples > 0:
            mean, count = partial_mean(result)
            weights = unflatten(mean, self.like, self.names)
            bound = result.error_bound * result.max_weight / result.num_examples
        self.note_blamed()
        rejected = list(self.rejected)
        if self.abandoned is not None:
            rejected.append({"client": f"{len(self.asked)} clients", "reason": f"secure aggregation: {self.abandoned}"})
        metrics = {k: v / self.eval_examples for k, v in self.metrics.items()} if self.eval_examples else {}
        survivors = result.survivors if weights is not None else ()
        msg = Partial(run=run, round=self.round, version=self.version, num_updates=len(survivors),
                      num_examples=sum(self.claimed.get(c, 0) for c in survivors), clients=tuple(survivors),
                      rejected=tuple(rejected + counted), missing=tuple(str(p) for p in self.missing()),
                      metrics=metrics, eval_examples=self.eval_examples, update_bytes=self.update_bytes,
                      delta=True, checkpoint=checkpoint, weight=count, error_bound=bound,
                      dropped=result.dropped if result is not None else (),
                      protocol_bytes=(self.bytes_in, self.bytes_out))
        return msg, weights
