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

import dataclasses
import os
from typing import Mapping

import numpy as np

from nebula.federated.checks import Refusal
from nebula.federated.combiner.round_state import RoundState
from nebula.federated.messages import MASKED_TENSOR, ClientUpdate, Partial
from nebula.federated.secagg import (AdvertiseKeys, KeyRoster, MaskedInput, SecAggConfig, SecAggRefused,
                                     SecAggServer, SecureSum, ShareCheck, ShareDelivery, ShareKeys, ShareVerdict,
                                     SurvivorSet, SurvivorSignature, UnmaskRequest, UnmaskResponse, Verifier,
                                     model_digest, partial_mean, unflatten)
from nebula.mean import Weights
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
        """Take a key, share, check, signature or reveal message of `who` (the channel it came on); why it is
        refused, or None."""
        if isinstance(msg, Malformed):
            return Refusal("malformed", msg.reason)
        if self.server is None:
            return Refusal("secagg", f"round {self.round} is not run at this combiner: {self.abandoned}")
        receive = {AdvertiseKeys: self.server.receive_keys, ShareKeys: self.server.receive_shares,
                   ShareCheck: self.server.receive_check, SurvivorSignature: self.server.receive_signature,
                   UnmaskResponse: self.server.receive_unmask}.get(type(msg))
        if receive is None:
            return Refusal("malformed", f"a {msg.TYPE} is not a secure aggregation stage message")
        why = self.impostor(who, msg)
        if why is not None:
            return why
        try:
            receive(msg)
        except SecAggRefused as exc:
            return self._kind(who, msg.round, str(exc))
        return None

    def impostor(self, who: str, msg: AdvertiseKeys | ShareKeys | ShareCheck | MaskedInput | SurvivorSignature |
                 UnmaskResponse) -> Refusal | None:
        """Why a stage message that names another client than `who`, the channel it came on, is refused (None: it
        names `who`)."""
        if msg.client == who:
            return None
        return self._kind(who, msg.round, f"{msg.TYPE} names client {str(msg.client)[:64]!r} but came from {who!r}; "
                                          "a client speaks for itself only")

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
    def close_keys(self) -> dict[str, KeyRoster]:
        """End stage 1: each client's roster of its neighbours' keys."""
        return self.server.rosters()

    def close_shares(self) -> dict[str, ShareDelivery]:
        """End stage 2: each client's shares, sealed for it by its neighbours, with their signed commitments (in
        the raw part after the header)."""
        return self.server.deliveries()

    def close_check(self) -> dict[str, ShareVerdict]:
        """End stage 3: complaints settled; each client still in gets the list of those left out."""
        return self.server.verdicts()

    def findings(self) -> tuple[dict[str, str], list[str]]:
        """(client -> what the share check or the reveal showed it did, the complaints that stayed unsettled)."""
        if self.server is None:
            return {}, []
        return dict(self.server.blamed), list(self.server.disputes)

    def close_masked(self) -> dict[str, SurvivorSet]:
        """End stage 4: the survivor set to each survivor, to sign (none when the round must be abandoned)."""
        try:
            sets = self.server.survivor_sets()
        except SecAggRefused as exc:
            self.abandoned = str(exc)
            return {}
        return sets

    def close_consistency(self) -> dict[str, UnmaskRequest]:
        """End stage 5: ask each survivor that signed for its shares, with its holders' signatures of the set."""
        if self.abandoned is not None or self.server.stage != "consistency":
            return {}
        return self.server.unmask_requests()

    # -- stage 4: the masked inputs ------------------------------------------------------------------------------
    def check_masked(self, who: str, msg: MaskedInput | Malformed, *, job: str) -> Refusal | None:
        """Why a masked update's header must be refused before its words are taken, or None."""
        if isinstance(msg, Malformed):
            return Refusal("malformed", msg.reason)
        if self.server is None:
            return Refusal("secagg", f"round {self.round} is not run at this combiner: {self.abandoned}")
        why = self.impostor(who, msg)
        if why is not None:
            return why
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

    def fold_masked(self, who: str, msg: MaskedInput, words: np.ndarray, *, nbytes: int) -> Refusal | None:
        """Add a checked masked update's words to the sum; why it is refused, or None."""
        try:
            self.server.receive_masked(dataclasses.replace(msg, words=words))
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
