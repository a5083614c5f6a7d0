"""The server side of SecAgg+ (a combiner, for its own clients) as a state machine with no I/O.

Each `receive_*` checks one client message against what the server can know (the round, the stage, the sender's
place in the graph, sizes) and raises SecAggRefused with a one-line reason, leaving the round intact for the
others. Each stage closes with one call that returns the next messages to send (`rosters`, `deliveries`,
`unmask_requests`); from then on a late message of the closed stage is refused — in particular a masked input that
arrives after the unmask requests went out, since the server is by then removing that client's pairwise masks.
Masked inputs are added up on arrival, so the server holds one vector, never one per client.
"""
from __future__ import annotations

from typing import Iterable

import numpy as np

from nebula.federated.secagg import crypto, shamir
from nebula.federated.secagg.client import MASK_PURPOSE, PLAINTEXT_BYTES, mask_sign, seed_commitment
from nebula.federated.secagg.graph import components, harary_graph
from nebula.federated.secagg.messages import (AdvertiseKeys, KeyRoster, MaskedInput, SecAggParams, SecAggRefused,
                                              SecureSum, ShareDelivery, ShareKeys, UnmaskRequest, UnmaskResponse)

__all__ = ["SecAggServer"]

SEALED_BYTES = crypto.NONCE_BYTES + PLAINTEXT_BYTES + crypto.TAG_BYTES
STAGES = ("advertise", "share_keys", "mask", "unmask", "done")


class SecAggServer:
    """One round of SecAgg+ over `params.clients`; `result()` gives the survivors' SecureSum."""

    def __init__(self, params: SecAggParams) -> None:
        self.params = params
        self.tag = params.tag()
        self.graph = harary_graph(params.clients, params.effective_degree, self.tag)
        self.stage = "advertise"
        self.keys: dict[str, AdvertiseKeys] = {}  # U1
        self.holders: dict[str, frozenset[str]] = {}  # owner -> who was sent its shares (itself included)
        self.shared: dict[str, ShareKeys] = {}  # U2
        self.excluded: dict[str, str] = {}  # client -> why it left the round before masking
        self.masked: set[str] = set()  # U3
        self._acc = np.zeros(params.vector_length + 1, params.quantizer.dtype)
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

    # -- stage 1 -----------------------------------------------------------------------------------------------
    def receive_keys(self, msg: AdvertiseKeys) -> None:
        """Take one client's public keys."""
        self._check(msg.client, msg.round, "advertise", self.params.clients)
        if msg.client in self.keys:
            raise self._refuse(msg.client, "advertised keys twice")
        if not (crypto.usable_public_key(msg.cipher_pk) and crypto.usable_public_key(msg.mask_pk)):
            raise self._refuse(msg.client, f"public keys must be {crypto.KEY_BYTES}-byte X25519 keys of full order")
        seen = {p for k in self.keys.values() for p in (k.cipher_pk, k.mask_pk)}
        if msg.cipher_pk == msg.mask_pk or {msg.cipher_pk, msg.mask_pk} & seen:
            raise self._refuse(msg.client, "reuses a public key; every key of a round is fresh")
        self.keys[msg.client] = msg

    def rosters(self) -> dict[str, KeyRoster]:
        """Close stage 1: each advertiser gets its own and its advertising neighbours' keys. A client with fewer
        than the threshold of holders is left out (its secrets could not be recovered), repeatedly until none is."""
        self.stage = "share_keys"
        alive = set(self.keys)
        while True:
            short = {c for c in alive if len(self.graph[c] & alive) + 1 < self.params.threshold}
            if not short:
                break
            for c in short:
                self.excluded[c] = (f"only {len(self.graph[c] & alive)} neighbours advertised keys; its secrets "
                                    f"need {self.params.threshold} holders")
            alive -= short
        for c in alive:
            self.holders[c] = frozenset(self.graph[c] & alive) | {c}
        return {c: KeyRoster(self.params.round, tuple(self.keys[h] for h in sorted(self.holders[c])))
                for c in sorted(alive)}

    # -- stage 2 -----------------------------------------------------------------------------------------------
    def receive_shares(self, msg: ShareKeys) -> None:
        """Take one client's sealed shares: exactly one for each neighbour on its roster."""
        self._check(msg.client, msg.round, "share_keys", self.holders)
        if msg.client in self.shared:
            raise self._refuse(msg.client, "sent its shares twice")
        want = self.holders[msg.client] - {msg.client}
        got = [e.receiver for e in msg.shares]
        if sorted(got) != sorted(want) or any(e.sender != msg.client for e in msg.shares):
            raise self._refuse(msg.client, f"shares for {sorted(got)}, expected one for each of {sorted(want)}")
        if any(len(e.ciphertext) != SEALED_BYTES for e in msg.shares) or len(msg.seed_commitment) != 32:
            raise self._refuse(msg.client, f"a sealed share is not {SEALED_BYTES} bytes or the commitment not 32")
        self.shared[msg.client] = msg

    def deliveries(self) -> dict[str, ShareDelivery]:
        """Close stage 2: each client that shared gets the shares sealed for it by neighbours that shared."""
        self.stage = "mask"
        for c in self.holders.keys() - self.shared.keys():
            self.excluded.setdefault(c, "sent no shares before the stage closed")
        box: dict[str, list] = {c: [] for c in self.shared}
        for msg in self.shared.values():
            for e in msg.shares:
                if e.receiver in box:
                    box[e.receiver].append(e)
        return {c: ShareDelivery(self.params.round, tuple(v)) for c, v in sorted(box.items())}

    def partners(self, client: str) -> frozenset[str]:
        """The clients whose pairwise masks are in `client`'s masked input: its neighbours that shared."""
        return frozenset(h for h in self.holders[client] if h in self.shared and h != client)

    # -- stage 3 -----------------------------------------------------------------------------------------------
    def check_masked(self, client: str, round_: int) -> None:
        """SecAggRefused unless a masked input of `client` for `round_` is taken now: what a combiner checks before
        it takes the words in."""
        self._check(client, round_, "mask", self.shared)
        if client in self.masked:
            raise self._refuse(client, "sent a masked input twice")

    def receive_masked(self, msg: MaskedInput) -> None:
        """Take one masked input and add it to the running sum (mod 2^b)."""
        self.check_masked(msg.client, msg.round)
        q = self.params.quantizer
        w = msg.words
        if not isinstance(w, np.ndarray) or w.dtype != q.dtype or w.shape != self._acc.shape:
            raise self._refuse(msg.client, f"masked input must be {self._acc.size} words of {q.dtype}, got "
                               f"{getattr(w, 'shape', '?')} of {getattr(w, 'dtype', type(w).__name__)}")
        self._acc += w
        self.masked.add(msg.client)

    def unmask_requests(self) -> dict[str, UnmaskRequest]:
        """Close stage 3: ask each survivor for its shares. Refused (the round ends, nothing is revealed) with
        fewer survivors than the threshold, or survivors in groups no pairwise mask joins (each group's sum
        would come out, not only the total)."""
        self.stage = "unmask"
        survivors = self.masked
        if len(survivors) < self.params.threshold:
            raise SecAggRefused(f"secagg round {self.params.round}: only {len(survivors)} clients sent masked "
                                f"inputs, fewer than the threshold {self.params.threshold}; the round is abandoned")
        groups = components(survivors, {c: self.partners(c) for c in survivors})
        if len(groups) > 1:
            raise SecAggRefused(f"secagg round {self.params.round}: the {len(survivors)} survivors fall into "
                                f"{len(groups)} groups no mask joins (sizes {sorted(map(len, groups))}); unmasking "
                                "would reveal each group's sum, so the round is abandoned")
        dropped = set(self.shared) - survivors
        for c in sorted(survivors):
            held = self.partners(c) | {c}
            self.requests[c] = UnmaskRequest(self.params.round, tuple(sorted(held & survivors)),
                                             tuple(sorted(held & dropped)))
        return dict(self.requests)

    # -- stage 4 -----------------------------------------------------------------------------------------------
    def receive_unmask(self, msg: UnmaskResponse) -> None:
        """Take one survivor's shares; only those its request asked for."""
        self._check(msg.client, msg.round, "unmask", self.requests)
        if msg.client in self.responded:
            raise self._refuse(msg.client, "answered the unmask request twice")
        req = self.requests[msg.client]
        if (tuple(o for o, _ in msg.seed_shares) != req.survivors
                or tuple(o for o, _ in msg.key_shares) != req.dropped):
            raise self._refuse(msg.client, "the shares do not match the clients its request named")
        if any(len(s) != shamir.SHARE_BYTES for _, s in (*msg.seed_shares, *msg.key_shares)):
            raise self._refuse(msg.client, f"a share is not {shamir.SHARE_BYTES} bytes")
        x = self.params.point(msg.client)
        for o, s in msg.seed_shares:
            self._seed_sh.setdefault(o, {})[x] = s
        for o, s in msg.key_shares:
            self._key_sh.setdefault(o, {})[x] = s
        self.responded.add(msg.client)

    def _recover(self, owner: str, book: dict[str, dict[int, bytes]], what: str) -> bytes:
        got = book.get(owner, {})
        t = self.params.threshold
        if len(got) < t:
            raise SecAggRefused(f"secagg round {self.params.round}: {len(got)} shares of the {what} of {owner!r} "
                                f"arrived, {t} are needed; the round is abandoned")
        return shamir.combine(sorted(got.items())[:t])

    def result(self) -> SecureSum:
        """Close stage 4: strip the survivors' self masks and the dropped clients' pairwise masks; decode."""
        self.stage = "done"
        acc = self._acc.copy()
        q = self.params.quantizer
        streams = crypto.Keystreams(acc.size, q.dtype)
        for u in sorted(self.masked):
            seed = self._recover(u, self._seed_sh, "self-mask seed")
            if seed_commitment(self.tag, seed) != self.shared[u].seed_commitment:
                raise SecAggRefused(f"secagg round {self.params.round}: the self-mask seed of {u!r} rebuilt from "
                                    "its shares fails its commitment (a holder sent a wrong share); abandoned")
            acc -= streams.words(seed)
        dropped = tuple(sorted(set(self.shared) - self.masked))
        for w in dropped:
            sk = self._recover(w, self._key_sh, "mask key")
            if crypto.public_key(sk) != self.keys[w].mask_pk:
                raise SecAggRefused(f"secagg round {self.params.round}: the mask key of {w!r} rebuilt from its "
                                    "shares does not match its public key (a holder sent a wrong share); abandoned")
            for v in sorted(self.partners(w) & self.masked):
                s = crypto.agree(sk, self.keys[v].mask_pk, crypto.pair_info(MASK_PURPOSE, self.tag, w, v))
                if mask_sign(v, w) > 0:  # v added this mask: take it away
                    acc -= streams.words(s)
                else:
                    acc += streams.words(s)
        vector, count = q.decode_sum(acc)
        return SecureSum(self.params.round, vector, count, q.max_weight, tuple(sorted(self.masked)), dropped,
                         q.error_bound(len(self.masked)))
