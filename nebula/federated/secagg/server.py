"""The server side of SecAgg+ (a combiner, for its own clients) as a state machine with no I/O.

Each `receive_*` checks one client message against what the server can know (the round, the stage, the sender's
place in the graph, sizes, and with a `Verifier` the sender's signatures) and raises SecAggRefused with a one-line
reason, leaving the round intact for the others. Each stage closes with one call that returns the next messages to
send (`rosters`, `deliveries`, `verdicts`, `survivor_sets`, `unmask_requests`); from then on a late message of the
closed stage is refused — in particular a masked input that arrives after the survivor set went out, since the
server is by then removing that client's pairwise masks.

Verifiable shares (`vss`): each dealer's signed Feldman commitments travel with its shares; every receiver checks
its shares and complains about a bad one with the key of that one share (`receive_check`). The server settles each
complaint itself: the key must be the one the dealer said it sealed under (its `key_check`), then the share must
open and lie on the dealer's committed polynomials. A dealer proven bad, or a complainer proven false, is `blamed`
and left out of the round before any masked input (`verdicts`: nobody masks with it); an unsettled complaint (the
dealer's key check and the complainer's key disagree: one of them lies, which one cannot be shown) voids that one
share, and a dealer left with fewer than the threshold of valid holders is left out unblamed. At the reveal each
secret is rebuilt from t shares and checked against its commitment (`verify_secret`); when that fails, each of the
owner's shares is checked, the senders of wrong ones blamed (never the owner), and the secret rebuilt from t good
ones: a wrong share among the t used always changes the secret (every Lagrange coefficient at 0 is non-zero).

Public weights: each masked input carries its sender's signed weight min(n_i, W); the unmasked sum is range-checked
against them (`Quantizer.check_sum_range`) and the round refused when a client sent out-of-range words.
Masked inputs are added up on arrival, so the server holds one vector, never one per client.
"""
from __future__ import annotations

from typing import Callable, Iterable

import numpy as np

from nebula.federated.secagg import crypto, shamir, vss
from nebula.federated.secagg.client import (MASK_PURPOSE, PLAINTEXT_BYTES, commitments_statement, keys_statement,
                                            mask_sign, open_share, share_key_check, weight_statement)
from nebula.federated.secagg.graph import components, harary_graph
from nebula.federated.secagg.messages import (AdvertiseKeys, EncryptedShare, KeyRoster, MaskedInput, SecAggParams,
                                              SecAggRefused, SecureSum, ShareCheck, ShareDelivery, ShareKeys,
                                              ShareVerdict, SurvivorSet, SurvivorSignature, UnmaskRequest,
                                              UnmaskResponse)
from nebula.federated.secagg.vouch import MAX_CHAIN_BYTES, MAX_SIGNATURE_BYTES, Verifier

__all__ = ["SecAggServer"]

SEALED_BYTES = crypto.NONCE_BYTES + PLAINTEXT_BYTES + crypto.TAG_BYTES
STAGES = ("advertise", "share_keys", "check_shares", "mask", "consistency", "unmask", "done")


class SecAggServer:
    """One round of SecAgg+ over `params.clients`; `result()` gives the survivors' SecureSum. With `verifier`, the
    clients' key signatures, the dealers' commitment signatures and the clients' weight signatures are checked on
    arrival."""

    def __init__(self, params: SecAggParams, verifier: Verifier | None = None) -> None:
        self.params, self.verifier = params, verifier
        self.tag = params.tag()
        self.graph = harary_graph(params.clients, params.effective_degree, self.tag)
        self.stage = "advertise"
        self.keys: dict[str, AdvertiseKeys] = {}  # U1
        self.holders: dict[str, frozenset[str]] = {}  # owner -> who was sent its shares (itself included)
        self.shared: dict[str, ShareKeys] = {}  # U2
        self.commitments: dict[str, tuple[vss.Commitments, vss.Commitments]] = {}  # dealer -> (seed, key)
        self.excluded: dict[str, str] = {}  # client -> why it left the round before masking
        self.checked: set[str] = set()  # clients that sent their share check
        self.void: set[tuple[str, str]] = set()  # (dealer, holder): a disputed share, held by nobody
        self.disputes: list[str] = []  # one line per complaint that could not be settled
        self.blamed: dict[str, str] = {}  # client -> what it was shown to have done (audited; not invited again)
        self.active: frozenset[str] = frozenset()  # U2 less those left out after the share check
        self.masked: set[str] = set()  # U3
        self.weights: dict[str, int] = {}  # survivor -> its signed public weight
        self._acc = np.zeros(params.vector_length, params.quantizer.dtype)
        self.survivors: tuple[str, ...] = ()
        self.signatures: dict[str, bytes] = {}  # survivor -> its signature of the survivor set
        self.requests: dict[str, UnmaskRequest] = {}
        self._seed_sh: dict[str, dict[int, bytes]] = {}
        self._key_sh: dict[str, dict[int, bytes]] = {}
        self.responded: set[str] = set()

    # -- helpers -----------------------------------------------------------------------------------------------
    def _refuse(self, who: str, what: str) -> SecAggRefused:
        return SecAggRefused(f"secagg round {self.params.round} ({self.stage}): client {who!r}: {what}")

    def _check(self, who: str, round_: int, stage: str, allowed: Iterable[str]) -> None:
        if round_ != self.params.round:
            raise self._refuse(who, f"message of round {round_}, this round is {self.params.round}")
        if self.stage != stage:
            late = STAGES.index(self.stage) > STAGES.index(stage)
            raise self._refuse(who, f"{stage} message {'after' if late else 'before'} that stage"
                               + ("; it was counted as dropped and joins the next round" if late else ""))
        if who not in allowed:
            raise self._refuse(who, f"not expected at {stage} (not in the round, or left it earlier)")

    def _leave_out_short(self, alive: set[str], holders: Callable[[str, set[str]], int],
                         why: Callable[[int], str]) -> set[str]:
        """`alive` less, repeatedly until none is, each client whose `holders(c, alive)` is under the threshold
        (its secrets could not be recovered); each one left out is recorded in `excluded` with `why(holders)`."""
        while True:
            counts = {c: holders(c, alive) for c in alive}
            short = {c for c, n in counts.items() if n < self.params.threshold}
            if not short:
                return alive
            for c in short:
                self.excluded[c] = why(counts[c])
            alive = alive - short

    # -- stage 1 -----------------------------------------------------------------------------------------------
    def receive_keys(self, msg: AdvertiseKeys) -> None:
        """Take one client's public keys."""
        self._check(msg.client, msg.round, "advertise", self.params.clients)
        if msg.client in self.keys:
            raise self._refuse(msg.client, "advertised keys twice")
        if not (crypto.usable_public_key(msg.cipher_pk) and crypto.usable_public_key(msg.mask_pk)):
            raise self._refuse(msg.client, f"public keys must be {crypto.KEY_BYTES}-byte X25519 keys of full order")
        if not (0 < len(msg.chain) <= MAX_CHAIN_BYTES and 0 < len(msg.signature) <= MAX_SIGNATURE_BYTES):
            raise self._refuse(msg.client, f"keys must come signed: a certificate of 1..{MAX_CHAIN_BYTES} bytes and a "
                               f"signature of 1..{MAX_SIGNATURE_BYTES}")
        seen = {p for k in self.keys.values() for p in (k.cipher_pk, k.mask_pk)}
        if msg.cipher_pk == msg.mask_pk or {msg.cipher_pk, msg.mask_pk} & seen:
            raise self._refuse(msg.client, "reuses a public key; every key of a round is fresh")
        if self.verifier is not None:  # else each neighbour refuses the roster it is on, and sits the round out
            why = self.verifier.refusal(msg.client, msg.chain, keys_statement(
                self.tag, self.params, msg.client, msg.cipher_pk, msg.mask_pk), msg.signature)
            if why is not None:
                raise self._refuse(msg.client, f"keys not signed by its certificate ({why})")
        self.keys[msg.client] = msg

    def rosters(self) -> dict[str, KeyRoster]:
        """Close stage 1: each advertiser gets its own and its advertising neighbours' keys. A client with fewer
        than the threshold of holders is left out (its secrets could not be recovered), repeatedly until none is."""
        self.stage = "share_keys"
        alive = self._leave_out_short(
            set(self.keys), lambda c, alive: len(self.graph[c] & alive) + 1,
            lambda n: f"only {n - 1} neighbours advertised keys; its secrets need {self.params.threshold} holders")
        for c in alive:
            self.holders[c] = frozenset(self.graph[c] & alive) | {c}
        return {c: KeyRoster(self.params.round, tuple(self.keys[h] for h in sorted(self.holders[c])))
                for c in sorted(alive)}

    # -- stage 2 -----------------------------------------------------------------------------------------------
    def receive_shares(self, msg: ShareKeys) -> None:
        """Take one client's sealed shares (exactly one for each neighbour on its roster) and its commitments."""
        self._check(msg.client, msg.round, "share_keys", self.holders)
        if msg.client in self.shared:
            raise self._refuse(msg.client, "sent its shares twice")
        want = self.holders[msg.client] - {msg.client}
        got = [e.receiver for e in msg.shares]
        if sorted(got) != sorted(want) or any(e.sender != msg.client for e in msg.shares):
            raise self._refuse(msg.client, f"shares for {sorted(got)}, expected one for each of {sorted(want)}")
        if any(len(e.ciphertext) != SEALED_BYTES or len(e.key_check) != 32 for e in msg.shares):
            raise self._refuse(msg.client, f"a sealed share is not {SEALED_BYTES} bytes or its key check not 32")
        c, t = msg.commitments, self.params.threshold
        try:
            parsed = (vss.Commitments.from_bytes(c.seed, t), vss.Commitments.from_bytes(c.key, t))
        except ValueError as exc:
            raise self._refuse(msg.client, f"share commitments: {exc}") from None
        if c.dealer != msg.client or not 0 < len(c.signature) <= MAX_SIGNATURE_BYTES:
            raise self._refuse(msg.client, f"commitments must be its own, signed (1..{MAX_SIGNATURE_BYTES} bytes)")
        if self.verifier is not None:
            why = self.verifier.refusal(msg.client, self.keys[msg.client].chain,
                                        commitments_statement(self.tag, msg.client, c.seed, c.key), c.signature)
            if why is not None:
                raise self._refuse(msg.client, f"share commitments not signed by its certificate ({why})")
        self.shared[msg.client], self.commitments[msg.client] = msg, parsed

    def deliveries(self) -> dict[str, ShareDelivery]:
        """Close stage 2: each client that shared gets the shares sealed for it by neighbours that shared, with
        those dealers' signed commitments."""
        self.stage = "check_shares"
        for c in self.holders.keys() - self.shared.keys():
            self.excluded.setdefault(c, "sent no shares before the stage closed")
        box: dict[str, list] = {c: [] for c in self.shared}
        for msg in self.shared.values():
            for e in msg.shares:
                if e.receiver in box:
                    box[e.receiver].append(e)
        # (the key checks stay here: they settle complaints, the receiver has no use for them)
        return {c: ShareDelivery(self.params.round,
                                 tuple(EncryptedShare(e.sender, e.receiver, e.ciphertext) for e in v),
                                 tuple(self.shared[e.sender].commitments for e in v))
                for c, v in sorted(box.items())}

    # -- stage 3: check shares -------------------------------------------------------------------------------------
    def receive_check(self, msg: ShareCheck) -> None:
        """Take one receiver's share check and settle each of its complaints (see the module docstring)."""
        r = msg.client
        self._check(r, msg.round, "check_shares", self.shared)
        if r in self.checked:
            raise self._refuse(r, "sent its share check twice")
        dealers = [c.dealer for c in msg.complaints]
        if len(set(dealers)) != len(dealers) or any(
                d not in self.shared or r not in self.holders[d] or d == r for d in dealers):
            raise self._refuse(r, "a complaint names a dealer twice, or one that dealt it no share")
        if any(not isinstance(c.key, bytes) or len(c.key) != crypto.KEY_BYTES for c in msg.complaints):
            raise self._refuse(r, f"a complaint's key is {crypto.KEY_BYTES} bytes")
        self.checked.add(r)
        for c in msg.complaints:
            d = c.dealer
            e = next(e for e in self.shared[d].shares if e.receiver == r)
            if share_key_check(self.tag, d, r, c.key) != e.key_check:
                self.void.add((d, r))
                self.disputes.append(f"{r!r} complains about the share of {d!r} with a key that {d!r} says it did "
                                     "not seal it under: unsettled (one of them lies), that share is void")
                continue
            opened = open_share(self.tag, self.params, e, c.key, *self.commitments[d])
            if isinstance(opened, str):
                self.blamed.setdefault(d, f"dealt {r!r} a bad share: {opened}")
            else:
                self.blamed.setdefault(r, f"complained falsely about the share of {d!r}: it opens under the key "
                                          "and lies on the dealer's committed polynomials")

    def _valid_holders(self, owner: str, active: set[str]) -> set[str]:
        return {h for h in self.holders[owner] & active if (owner, h) not in self.void}

    def verdicts(self) -> dict[str, ShareVerdict]:
        """Close stage 3: leave out the blamed, those that sent no check, and (repeatedly) dealers with fewer than
        the threshold of valid holders left; every client still in gets the list."""
        self.stage = "mask"
        active = set(self.shared)
        for c in sorted(active - self.checked):
            self.excluded.setdefault(c, "sent no share check before the stage closed")
        for c, why in self.blamed.items():
            self.excluded.setdefault(c, why)
        active = self._leave_out_short(
            active - set(self.excluded), lambda c, active: len(self._valid_holders(c, active)),
            lambda n: f"only {n} holders keep a valid share of its secrets, fewer than the threshold "
                      f"{self.params.threshold}")
        self.active = frozenset(active)
        out = tuple(sorted(set(self.shared) - active))
        return {c: ShareVerdict(self.params.round, out) for c in sorted(active)}

    def partners(self, client: str) -> frozenset[str]:
        """The clients whose pairwise masks are in `client`'s masked input: its neighbours left in the round."""
        return frozenset(h for h in self.holders[client] if h in self.active and h != client)

    # -- stage 4 -----------------------------------------------------------------------------------------------
    def check_masked(self, client: str, round_: int) -> None:
        """SecAggRefused unless a masked input of `client` for `round_` is taken now: what a combiner checks before
        it takes the words in."""
        self._check(client, round_, "mask", self.active)
        if client in self.masked:
            raise self._refuse(client, "sent a masked input twice")

    def check_weight(self, client: str, weight: object, signature: bytes) -> int:
        """`client`'s public weight if it is one a client may claim (1..max_weight) and, with a verifier, signed
        by its certificate; else SecAggRefused."""
        try:
            w = self.params.quantizer.check_weight(weight)
        except ValueError as exc:
            raise self._refuse(client, str(exc)) from None
        if not isinstance(signature, bytes) or not 0 < len(signature) <= MAX_SIGNATURE_BYTES:
            raise self._refuse(client, f"a weight comes signed (1..{MAX_SIGNATURE_BYTES} bytes)")
        if self.verifier is not None:
            why = self.verifier.refusal(client, self.keys[client].chain, weight_statement(self.tag, client, w),
                                        signature)
            if why is not None:
                raise self._refuse(client, f"its weight is not signed by its certificate ({why})")
        return w

    def receive_masked(self, msg: MaskedInput) -> None:
        """Take one masked input and its signed weight, and add the words to the running sum (mod 2^b)."""
        self.check_masked(msg.client, msg.round)
        q = self.params.quantizer
        w = msg.words
        if not isinstance(w, np.ndarray) or w.dtype != q.dtype or w.shape != self._acc.shape:
            raise self._refuse(msg.client, f"masked input must be {self._acc.size} words of {q.dtype}, got "
                               f"{getattr(w, 'shape', '?')} of {getattr(w, 'dtype', type(w).__name__)}")
        weight = self.check_weight(msg.client, msg.weight, msg.signature)
        self._acc += w
        self.masked.add(msg.client)
        self.weights[msg.client] = weight

    def survivor_sets(self) -> dict[str, SurvivorSet]:
        """Close stage 4: send each survivor the survivor set to sign. Refused (the round ends, nothing is revealed)
        with fewer survivors than the threshold, or survivors in groups no pairwise mask joins (each group's sum
        would come out, not only the total)."""
        self.stage = "consistency"
        survivors = self.masked
        if len(survivors) < self.params.threshold:
            raise SecAggRefused(f"secagg round {self.params.round}: only {len(survivors)} clients sent masked "
                                f"inputs, fewer than the threshold {self.params.threshold}; the round is abandoned")
        groups = components(survivors, {c: self.partners(c) for c in survivors})
        if len(groups) > 1:
            raise SecAggRefused(f"secagg round {self.params.round}: the {len(survivors)} survivors fall into "
                                f"{len(groups)} groups no mask joins (sizes {sorted(map(len, groups))}); unmasking "
                                "would reveal each group's sum, so the round is abandoned")
        self.survivors = tuple(sorted(survivors))
        return {c: SurvivorSet(self.params.round, self.survivors) for c in self.survivors}

    # -- stage 5: consistency ------------------------------------------------------------------------------------
    def receive_signature(self, msg: SurvivorSignature) -> None:
        """Take one survivor's signature of the survivor set (each client checks its holders' signatures)."""
        self._check(msg.client, msg.round, "consistency", self.survivors)
        if msg.client in self.signatures:
            raise self._refuse(msg.client, "signed the survivor set twice")
        if not 0 < len(msg.signature) <= MAX_SIGNATURE_BYTES:
            raise self._refuse(msg.client, f"a survivor-set signature is 1..{MAX_SIGNATURE_BYTES} bytes")
        self.signatures[msg.client] = msg.signature

    def unmask_requests(self) -> dict[str, UnmaskRequest]:
        """Close stage 5: ask each survivor that signed for its shares, with the signatures of its holders."""
        self.stage = "unmask"
        for c in self.signatures:
            sigs = tuple((h, self.signatures[h]) for h in sorted(self.partners(c)) if h in self.signatures)
            if len(sigs) + 1 >= self.params.threshold:
                self.requests[c] = UnmaskRequest(self.params.round, self.survivors, sigs)
        return dict(self.requests)

    # -- stage 6 -----------------------------------------------------------------------------------------------
    def _held_by(self, client: str) -> set[str]:
        """The owners whose valid shares `client` holds: itself and its partners, less the voided shares."""
        return {o for o in self.partners(client) | {client} if (o, client) not in self.void}

    def receive_unmask(self, msg: UnmaskResponse) -> None:
        """Take one survivor's shares; only those its request asked for."""
        self._check(msg.client, msg.round, "unmask", self.requests)
        if msg.client in self.responded:
            raise self._refuse(msg.client, "answered the unmask request twice")
        held = self._held_by(msg.client)
        alive, dropped = sorted(held & self.masked), sorted(held - self.masked)
        if [o for o, _ in msg.seed_shares] != alive or [o for o, _ in msg.key_shares] != dropped:
            raise self._refuse(msg.client, "the shares do not match the clients its request named")
        if any(len(s) != shamir.SHARE_BYTES for _, s in (*msg.seed_shares, *msg.key_shares)):
            raise self._refuse(msg.client, f"a share is not {shamir.SHARE_BYTES} bytes")
        x = self.params.point(msg.client)
        for o, s in msg.seed_shares:
            self._seed_sh.setdefault(o, {})[x] = s
        for o, s in msg.key_shares:
            self._key_sh.setdefault(o, {})[x] = s
        self.responded.add(msg.client)

    def _recover(self, owner: str, book: dict[str, dict[int, bytes]], which: int, what: str) -> bytes:
        """`owner`'s secret from t of its revealed shares, checked against its commitment; see the module docstring
        for when each share is checked and who is blamed for a wrong one."""
        comm, t = self.commitments[owner][which], self.params.threshold
        points = sorted(book.get(owner, {}).items())
        if len(points) >= t:
            secret = shamir.combine(points[:t])
            if vss.verify_secret(secret, comm):
                return secret
        good = []
        for x, s in points:
            if vss.verify_share(x, s, comm):
                good.append((x, s))
            else:
                self.blamed.setdefault(self.params.clients[x - 1], f"revealed a share of the {what} of {owner!r} "
                                       "that is not on its committed polynomial")
        if len(good) < t:
            raise SecAggRefused(f"secagg round {self.params.round}: {len(good)} valid shares of the {what} of "
                                f"{owner!r} arrived ({len(points) - len(good)} wrong), {t} are needed; the round is "
                                "abandoned")
        secret = shamir.combine(good[:t])
        if not vss.verify_secret(secret, comm):  # shares on its polynomial, a secret off its C_0: the dealer's doing
            raise SecAggRefused(f"secagg round {self.params.round}: the {what} of {owner!r} rebuilt from valid shares "
                                "fails its commitment; the round is abandoned")
        return secret

    def result(self) -> SecureSum:
        """Close stage 6: strip the survivors' self masks and the dropped clients' pairwise masks, range-check the
        sum against the survivors' public weights, decode."""
        self.stage = "done"
        acc = self._acc.copy()
        q = self.params.quantizer
        streams = crypto.Keystreams(acc.size, q.dtype)
        for u in sorted(self.masked):
            acc -= streams.words(self._recover(u, self._seed_sh, 0, "self-mask seed"))
        dropped = tuple(sorted(self.active - self.masked))
        for w in dropped:
            sk = self._recover(w, self._key_sh, 1, "mask key")
            if crypto.public_key(sk) != self.keys[w].mask_pk:
                raise SecAggRefused(f"secagg round {self.params.round}: the mask key of {w!r} rebuilt from its "
                                    "shares does not match its public key; the round is abandoned")
            for v in sorted(self.partners(w) & self.masked):
                s = crypto.agree(sk, self.keys[v].mask_pk, crypto.pair_info(MASK_PURPOSE, self.tag, w, v))
                if mask_sign(v, w) > 0:  # v added this mask: take it away
                    acc -= streams.words(s)
                else:
                    acc += streams.words(s)
        weights = [self.weights[u] for u in sorted(self.masked)]
        try:
            q.check_sum_range(acc, weights)
        except ValueError as exc:
            raise SecAggRefused(f"secagg round {self.params.round}: {exc}") from None
        total = sum(weights)
        return SecureSum(self.params.round, q.decode_sum(acc, total), total, q.max_weight,
                         tuple(sorted(self.masked)), dropped, q.error_bound(len(self.masked)))
