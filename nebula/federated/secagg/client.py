"""The client side of SecAgg+ as a state machine with no I/O: each stage takes the server's message and returns
the client's answer, or raises SecAggRefused with the reason (then the client sits the round out).

What a client never does, whatever the server asks: reveal both its share of a neighbour's self-mask seed and its
share of that neighbour's mask key (that would let the server strip the neighbour's masks); answer a stage twice or
out of order; unmask when fewer than the threshold of its share holders survived; take keys or shares from anyone
outside its graph neighbourhood, which it computes itself from the round's parameters.
"""
from __future__ import annotations

import hashlib
import os
from typing import Callable

import numpy as np

from nebula.federated.secagg import crypto, shamir
from nebula.federated.secagg.graph import harary_graph
from nebula.federated.secagg.messages import (AdvertiseKeys, EncryptedShare, KeyRoster, MaskedInput, SecAggParams,
                                              SecAggRefused, ShareDelivery, ShareKeys, UnmaskRequest, UnmaskResponse)

__all__ = ["SecAggClient", "SHARE_PURPOSE", "MASK_PURPOSE", "share_aad", "mask_sign", "seed_commitment"]

SHARE_PURPOSE = b"nebula secagg+ share"
MASK_PURPOSE = b"nebula secagg+ mask"
PLAINTEXT_BYTES = 2 * shamir.SHARE_BYTES


def share_aad(tag: bytes, sender: str, receiver: str) -> bytes:
    """Authenticated data of a sealed share: the round's tag and the direction, so it cannot be redirected."""
    s, r = sender.encode(), receiver.encode()
    return tag + len(s).to_bytes(2, "big") + s + len(r).to_bytes(2, "big") + r


def mask_sign(me: str, peer: str) -> int:
    """+1 if `me` adds the pairwise mask it shares with `peer`, −1 if it subtracts it: the pair's masks cancel."""
    return 1 if me < peer else -1


def seed_commitment(tag: bytes, seed: bytes) -> bytes:
    """SHA-256 commitment to a self-mask seed: the server checks a reconstruction against it."""
    return hashlib.sha256(b"nebula secagg+ seed" + tag + seed).digest()


class SecAggClient:
    """One client's round of SecAgg+: advertise → share_keys → mask → unmask."""

    def __init__(self, client: str, params: SecAggParams,
                 random_bytes: Callable[[int], bytes] = os.urandom) -> None:
        if client not in params.clients:
            raise SecAggRefused(f"secagg round {params.round}: client {client!r} is not among the round's "
                                f"{len(params.clients)} clients; wait for a round that lists it")
        self.client, self.params, self._rand = client, params, random_bytes
        self.tag = params.tag()
        self.neighbours = harary_graph(params.clients, params.effective_degree, self.tag)[client]
        self.stage = "advertise"
        self._cipher_sk, self._cipher_pk = crypto.keypair(random_bytes)
        self._mask_sk, self._mask_pk = crypto.keypair(random_bytes)
        self._roster: dict[str, AdvertiseKeys] = {}
        self._held: dict[str, tuple[bytes, bytes]] = {}  # owner -> (its seed share, its key share) that we hold
        self._seed = b""

    def _refuse(self, what: str) -> SecAggRefused:
        return SecAggRefused(f"secagg round {self.params.round} client {self.client!r} ({self.stage}): {what}")

    def _expect(self, stage: str, round_: int) -> None:
        if self.stage != stage:
            raise self._refuse(f"asked for {stage} out of order; this round's client can only {self.stage} now")
        if round_ != self.params.round:
            raise self._refuse(f"message of round {round_}; this client runs round {self.params.round}")

    def advertise(self) -> AdvertiseKeys:
        """Stage 1: this round's two public keys."""
        self._expect("advertise", self.params.round)
        self.stage = "share_keys"
        return AdvertiseKeys(self.client, self.params.round, self._cipher_pk, self._mask_pk)

    def share_keys(self, roster: KeyRoster) -> ShareKeys:
        """Stage 2: split the self-mask seed and the mask key among the holders, seal each neighbour's share."""
        self._expect("share_keys", roster.round)
        keys: dict[str, AdvertiseKeys] = {}
        for k in roster.keys:
            if k.client != self.client and k.client not in self.neighbours:
                raise self._refuse(f"the roster holds keys of {k.client!r}, not a neighbour in this round's graph")
            if k.client in keys:
                raise self._refuse(f"the roster lists {k.client!r} twice")
            keys[k.client] = k
        mine = keys.get(self.client)
        if mine is None or (mine.cipher_pk, mine.mask_pk) != (self._cipher_pk, self._mask_pk):
            raise self._refuse("the roster does not carry this client's own keys unchanged")
        pks = [p for k in keys.values() for p in (k.cipher_pk, k.mask_pk)]
        if len(set(pks)) != len(pks) or not all(map(crypto.usable_public_key, pks)):
            raise self._refuse("the roster repeats a public key or holds one that is not a usable X25519 key")
        holders = sorted(keys)
        if len(holders) < self.params.threshold:
            raise self._refuse(f"only {len(holders) - 1} of its {len(self.neighbours)} neighbours advertised keys; "
                               f"its secrets need {self.params.threshold} holders")
        seed = self._rand(shamir.SECRET_BYTES)
        xs = [self.params.point(h) for h in holders]
        t = self.params.threshold
        seed_sh = shamir.split(seed, t, xs, self._rand)
        key_sh = shamir.split(self._mask_sk, t, xs, self._rand)
        sealed = []
        for h, s, k in zip(holders, seed_sh, key_sh):
            if h == self.client:
                own = (s, k)
                continue
            key = crypto.agree(self._cipher_sk, keys[h].cipher_pk, crypto.pair_info(SHARE_PURPOSE, self.tag,
                                                                                    self.client, h))
            sealed.append(EncryptedShare(self.client, h, crypto.seal(key, s + k, share_aad(self.tag, self.client, h),
                                                                     self._rand)))
        self._roster, self._seed, self._held = keys, seed, {self.client: own}
        self.stage = "mask"
        return ShareKeys(self.client, self.params.round, seed_commitment(self.tag, seed), tuple(sealed))

    def mask(self, delivery: ShareDelivery, vector: np.ndarray, num_examples: int) -> MaskedInput:
        """Stage 3: open the neighbours' shares, then quantise `vector` (the flat update) and mask it."""
        self._expect("mask", delivery.round)
        held = dict(self._held)  # only kept when the whole stage succeeds: a refusal changes nothing
        for e in delivery.shares:
            if e.receiver != self.client or e.sender == self.client or e.sender not in self._roster:
                raise self._refuse(f"a share from {e.sender!r} to {e.receiver!r} is not for this client from a "
                                   "neighbour on its roster")
            if e.sender in held:
                raise self._refuse(f"two shares from {e.sender!r}")
            key = crypto.agree(self._cipher_sk, self._roster[e.sender].cipher_pk,
                               crypto.pair_info(SHARE_PURPOSE, self.tag, e.sender, self.client))
            try:
                plain = crypto.unseal(key, e.ciphertext, share_aad(self.tag, e.sender, self.client))
            except crypto.AuthenticationError:
                raise self._refuse(f"the share from {e.sender!r} fails authentication (altered or misaddressed)"
                                   ) from None
            if len(plain) != PLAINTEXT_BYTES:
                raise self._refuse(f"the share from {e.sender!r} is {len(plain)} bytes, not {PLAINTEXT_BYTES}")
            held[e.sender] = (plain[:shamir.SHARE_BYTES], plain[shamir.SHARE_BYTES:])
        if len(held) < self.params.threshold:
            raise self._refuse(f"holds shares of only {len(held) - 1} neighbours; the threshold is "
                               f"{self.params.threshold} holders (itself included)")
        vec = np.asarray(vector)
        if vec.shape != (self.params.vector_length,) or not np.issubdtype(vec.dtype, np.floating):
            raise self._refuse(f"update of shape {vec.shape} and dtype {vec.dtype}; the round masks float vectors of "
                               f"length {self.params.vector_length}")
        if not np.isfinite(vec).all():
            raise self._refuse("the update holds NaN or Inf; lower the learning rate or clip gradients")
        if isinstance(num_examples, bool) or int(num_examples) != num_examples or num_examples < 1:
            raise self._refuse(f"num_examples={num_examples!r} must be a positive integer")
        q = self.params.quantizer
        words = q.encode(vec, int(num_examples))
        streams = crypto.Keystreams(words.size, q.dtype)
        words += streams.words(self._seed)
        for peer in held:
            if peer == self.client:
                continue
            s = crypto.agree(self._mask_sk, self._roster[peer].mask_pk,
                             crypto.pair_info(MASK_PURPOSE, self.tag, self.client, peer))
            if mask_sign(self.client, peer) > 0:
                words += streams.words(s)
            else:
                words -= streams.words(s)
        self._held, self.stage = held, "unmask"
        return MaskedInput(self.client, self.params.round, words)

    def unmask(self, request: UnmaskRequest) -> UnmaskResponse:
        """Stage 4: seed shares of the survivors, key shares of the dropped; never both of one client."""
        self._expect("unmask", request.round)
        survivors, dropped = set(request.survivors), set(request.dropped)
        if survivors & dropped:
            raise self._refuse(f"asked for both shares of {sorted(survivors & dropped)}; that would unmask them")
        if self.client in dropped:
            raise self._refuse("the request calls this client dropped; its masked input must not be counted")
        unknown = (survivors | dropped) - set(self._held)
        if unknown:
            raise self._refuse(f"asked about {sorted(unknown)}, whose shares it does not hold")
        if len(survivors) < self.params.threshold:
            raise self._refuse(f"only {len(survivors)} of its share holders survived, fewer than the threshold "
                               f"{self.params.threshold}; the sum of so few would expose them")
        self.stage = "done"
        return UnmaskResponse(self.client, self.params.round,
                              tuple((o, self._held[o][0]) for o in sorted(survivors)),
                              tuple((o, self._held[o][1]) for o in sorted(dropped)))
