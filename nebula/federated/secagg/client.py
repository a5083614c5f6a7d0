"""The client side of SecAgg+ as a state machine with no I/O: each stage takes the server's message and returns
the client's answer, or raises SecAggRefused with the reason (then the client sits the round out).

What a client never does, whatever the server asks: reveal both its share of a neighbour's self-mask seed and its
share of that neighbour's mask key (that would let the server strip the neighbour's masks); answer a stage twice or
out of order; unmask when fewer than the threshold of its share holders survived; take keys or shares from anyone
outside its graph neighbourhood, which it computes itself from the round's parameters; take a neighbour's keys or
share commitments that the neighbour's certificate did not sign (`vouch`: a substituted key is refused, and the
round sat out); keep a share that fails its dealer's commitments (`vss`: it complains instead, giving the server
the key of that one share as evidence); reveal shares before at least the threshold of its share holders signed
the very survivor set it signed itself (the consistency check of Bonawitz et al. 2017 §4: one set per round, so no
two clients are told different stories); reveal shares twice for one round or one model (`Journal`: otherwise a
combiner that runs the same model again, calling a client dropped the second time, learns that client's update as
the difference of the sums).
"""
from __future__ import annotations

import hashlib
import os
from typing import Callable, Protocol

import numpy as np

from nebula.federated.secagg import crypto, shamir, vss
from nebula.federated.secagg.graph import harary_graph
from nebula.federated.secagg.messages import (AdvertiseKeys, Complaint, DealerCommitments, EncryptedShare, KeyRoster,
                                              MaskedInput, SecAggParams, SecAggRefused, ShareCheck, ShareDelivery,
                                              ShareKeys, ShareVerdict, SurvivorSet, SurvivorSignature, UnmaskRequest,
                                              UnmaskResponse)
from nebula.federated.secagg.vouch import Signer, Verifier, statement

__all__ = ["SecAggClient", "SHARE_PURPOSE", "MASK_PURPOSE", "share_aad", "share_info", "share_key_check",
           "open_share", "mask_sign", "keys_statement", "commitments_statement", "weight_statement",
           "survivors_statement", "Journal", "MemoryJournal"]

SHARE_PURPOSE = b"nebula secagg+ share"
SHARE_CHECK_PURPOSE = b"nebula secagg+ share key check"
MASK_PURPOSE = b"nebula secagg+ mask"
KEYS_PURPOSE = b"nebula secagg+ keys"
COMMITMENTS_PURPOSE = b"nebula secagg+ commitments"
WEIGHT_PURPOSE = b"nebula secagg+ weight"
SURVIVORS_PURPOSE = b"nebula secagg+ survivors"
PLAINTEXT_BYTES = 2 * shamir.SHARE_BYTES


def keys_statement(tag: bytes, params: SecAggParams, client: str, cipher_pk: bytes, mask_pk: bytes) -> bytes:
    """What a client signs for its keys: the round's tag (round, session, cohort, model version and digest,
    degree, threshold), its name, the round id and model version again in the clear, both public keys."""
    return statement(KEYS_PURPOSE, tag, client.encode(), str(params.round).encode(), str(params.version).encode(),
                     params.model, cipher_pk, mask_pk)


def commitments_statement(tag: bytes, client: str, seed: bytes, key: bytes) -> bytes:
    """What a dealer signs for its share commitments: the round's tag, its name and both commitment sets."""
    return statement(COMMITMENTS_PURPOSE, tag, client.encode(), seed, key)


def weight_statement(tag: bytes, client: str, weight: int) -> bytes:
    """What a client signs for its public weight min(n_i, W) in a round."""
    return statement(WEIGHT_PURPOSE, tag, client.encode(), str(weight).encode())


def survivors_statement(tag: bytes, client: str, survivors: tuple[str, ...]) -> bytes:
    """What a survivor signs in the consistency check: the round's tag, its name and the survivor set."""
    return statement(SURVIVORS_PURPOSE, tag, client.encode(), "\n".join(survivors).encode())


class Journal(Protocol):
    """The rounds and models a client has revealed shares for (kept durably by the caller where it can)."""

    def refusal(self, round_: int, model: bytes) -> str | None:
        """Why shares for this round on this model must not be revealed, or None."""

    def record(self, round_: int, model: bytes) -> None:
        """Remember that shares for this round on this model are being revealed (before they leave)."""


class MemoryJournal:
    """A `Journal` in memory only (a process that restarts forgets it; see nebula.federated.combiner.secure_state)."""

    def __init__(self) -> None:
        self.rounds: set[int] = set()
        self.models: set[bytes] = set()

    def refusal(self, round_: int, model: bytes) -> str | None:
        if round_ in self.rounds:
            return f"it already revealed shares for round {round_}; a round is unmasked once"
        if model in self.models:
            return (f"it already revealed shares for a round on this model ({model.hex()[:16]}); the same model "
                    "twice would let the difference of two sums expose a client")
        return None

    def record(self, round_: int, model: bytes) -> None:
        self.rounds.add(round_)
        self.models.add(model)


def share_aad(tag: bytes, sender: str, receiver: str) -> bytes:
    """Authenticated data of a sealed share: the round's tag and the direction, so it cannot be redirected."""
    s, r = sender.encode(), receiver.encode()
    return tag + len(s).to_bytes(2, "big") + s + len(r).to_bytes(2, "big") + r


def mask_sign(me: str, peer: str) -> int:
    """+1 if `me` adds the pairwise mask it shares with `peer`, −1 if it subtracts it: the pair's masks cancel."""
    return 1 if me < peer else -1


def share_info(tag: bytes, sender: str, receiver: str) -> bytes:
    """HKDF info of the key one share is sealed under: the round's tag and the direction (unlike a pairwise mask's,
    the key of sender -> receiver differs from that of receiver -> sender, so giving it away opens one share only)."""
    return statement(SHARE_PURPOSE, tag, sender.encode(), receiver.encode())


def share_key_check(tag: bytes, sender: str, receiver: str, key: bytes) -> bytes:
    """SHA-256 of a share's sealing key in its context: the dealer sends it with the share, so the server can tell
    whether a complaint's key is the one the dealer sealed under."""
    return hashlib.sha256(statement(SHARE_CHECK_PURPOSE, tag, sender.encode(), receiver.encode(), key)).digest()


def open_share(tag: bytes, params: SecAggParams, share: EncryptedShare, key: bytes, seed: vss.Commitments,
               mask_key: vss.Commitments) -> tuple[bytes, bytes] | str:
    """The (seed share, key share) sealed in `share` under `key` if both lie on the dealer's committed
    polynomials at the receiver's point, else why not (what the receiver and the server both check)."""
    try:
        plain = crypto.unseal(key, share.ciphertext, share_aad(tag, share.sender, share.receiver))
    except crypto.AuthenticationError:
        return "it does not open under its key (altered, misaddressed or sealed under another key)"
    if len(plain) != PLAINTEXT_BYTES:
        return f"it holds {len(plain)} bytes, not {PLAINTEXT_BYTES}"
    s, k = plain[:shamir.SHARE_BYTES], plain[shamir.SHARE_BYTES:]
    x = params.point(share.receiver)
    if not vss.verify_share(x, s, seed):
        return "its self-mask seed share is not on the dealer's committed polynomial"
    if not vss.verify_share(x, k, mask_key):
        return "its mask key share is not on the dealer's committed polynomial"
    return s, k


class SecAggClient:
    """One client's round of SecAgg+: advertise → share_keys → check_shares → mask → sign_survivors → unmask."""

    def __init__(self, client: str, params: SecAggParams, signer: Signer, verifier: Verifier,
                 journal: Journal | None = None, random_bytes: Callable[[int], bytes] = os.urandom) -> None:
        if client not in params.clients:
            raise SecAggRefused(f"secagg round {params.round}: client {client!r} is not among the round's "
                                f"{len(params.clients)} clients; wait for a round that lists it")
        self.client, self.params, self._rand = client, params, random_bytes
        self.signer, self.verifier = signer, verifier
        self.journal = journal if journal is not None else MemoryJournal()
        self.survivors: tuple[str, ...] | None = None  # the survivor set this client signed
        self.tag = params.tag()
        self.neighbours = harary_graph(params.clients, params.effective_degree, self.tag)[client]
        self.stage = "advertise"
        self._cipher_sk, self._cipher_pk = crypto.keypair(random_bytes)
        self._mask_sk, self._mask_pk = crypto.keypair(random_bytes)
        self._roster: dict[str, AdvertiseKeys] = {}
        self._held: dict[str, tuple[bytes, bytes]] = {}  # owner -> (its seed share, its key share), checked
        self._delivered: frozenset[str] = frozenset()  # the neighbours whose shares were delivered to us
        self._partners: frozenset[str] = frozenset()  # those left in the round: our holders and mask partners
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
        sig = self.signer.sign(keys_statement(self.tag, self.params, self.client, self._cipher_pk, self._mask_pk))
        return AdvertiseKeys(self.client, self.params.round, self._cipher_pk, self._mask_pk, self.signer.chain, sig)

    def share_keys(self, roster: KeyRoster) -> ShareKeys:
        """Stage 2: split the self-mask seed and the mask key among the holders (Feldman VSS: signed commitments),
        seal each neighbour's shares under a key for that one direction."""
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
        for k in keys.values():
            if k.client == self.client:
                continue
            why = self.verifier.refusal(k.client, k.chain, keys_statement(self.tag, self.params, k.client,
                                                                          k.cipher_pk, k.mask_pk), k.signature)
            if why is not None:
                raise self._refuse(f"the keys of {k.client!r} are not vouched for by its certificate ({why}): a "
                                   "substituted key; nothing is shared and the round is sat out")
            if k.round != self.params.round:
                raise self._refuse(f"the keys of {k.client!r} are of round {k.round}")
        pks = [p for k in keys.values() for p in (k.cipher_pk, k.mask_pk)]
        if len(set(pks)) != len(pks) or not all(map(crypto.usable_public_key, pks)):
            raise self._refuse("the roster repeats a public key or holds one that is not a usable X25519 key")
        holders = sorted(keys)
        if len(holders) < self.params.threshold:
            raise self._refuse(f"only {len(holders) - 1} of its {len(self.neighbours)} neighbours advertised keys; "
                               f"its secrets need {self.params.threshold} holders")
        seed = self._rand(shamir.SECRET_BYTES)
        while not any(seed):  # a zero secret's commitment is 1: never (2^-256), but split_verifiable refuses it
            seed = self._rand(shamir.SECRET_BYTES)
        xs = [self.params.point(h) for h in holders]
        t = self.params.threshold
        seed_sh, seed_c = vss.split_verifiable(seed, t, xs, self._rand)
        key_sh, key_c = vss.split_verifiable(self._mask_sk, t, xs, self._rand)
        sealed = []
        for h, s, k in zip(holders, seed_sh, key_sh):
            if h == self.client:
                own = (s, k)
                continue
            key = crypto.agree(self._cipher_sk, keys[h].cipher_pk, share_info(self.tag, self.client, h))
            sealed.append(EncryptedShare(self.client, h, crypto.seal(key, s + k, share_aad(self.tag, self.client, h),
                                                                     self._rand),
                                         share_key_check(self.tag, self.client, h, key)))
        sc, kc = seed_c.to_bytes(), key_c.to_bytes()
        commitments = DealerCommitments(self.client, sc, kc,
                                        self.signer.sign(commitments_statement(self.tag, self.client, sc, kc)))
        self._roster, self._seed, self._held = keys, seed, {self.client: own}
        self.stage = "check_shares"
        return ShareKeys(self.client, self.params.round, commitments, tuple(sealed))

    def check_shares(self, delivery: ShareDelivery) -> ShareCheck:
        """Stage 3: open each neighbour's shares and check them against its signed commitments; a complaint with
        the share's key for each that fails (its shares are not kept). Refused when the delivery itself is not
        what an honest server relays (a share without its dealer's signed commitments, a stranger's, twice)."""
        self._expect("check_shares", delivery.round)
        comm = {c.dealer: c for c in delivery.commitments}
        if len(comm) != len(delivery.commitments):
            raise self._refuse("the delivery lists a dealer's commitments twice")
        each = self.params.threshold * vss.ELEMENT_BYTES
        for c in delivery.commitments:
            if len(c.seed) != each or len(c.key) != each:
                raise self._refuse(f"the delivery's commitments of {c.dealer!r} are {len(c.seed)} and {len(c.key)} "
                                   f"bytes, not {each} each; the combiner relays malformed deliveries")
        held, complaints, senders = dict(self._held), [], set()
        for e in delivery.shares:
            if e.receiver != self.client or e.sender == self.client or e.sender not in self._roster:
                raise self._refuse(f"a share from {e.sender!r} to {e.receiver!r} is not for this client from a "
                                   "neighbour on its roster")
            if e.sender in senders:
                raise self._refuse(f"two shares from {e.sender!r}")
            senders.add(e.sender)
            c = comm.get(e.sender)
            k = self._roster[e.sender]
            why = None if c is None else self.verifier.refusal(
                e.sender, k.chain, commitments_statement(self.tag, e.sender, c.seed, c.key), c.signature)
            if why is not None or c is None:
                # the server checks every dealer's signature before it relays: the relay itself is at fault
                raise self._refuse(f"the share commitments of {e.sender!r} are missing or not signed by its "
                                   f"certificate ({why or 'none came'}); nothing is checked and the round is sat out")
            key = crypto.agree(self._cipher_sk, k.cipher_pk, share_info(self.tag, e.sender, self.client))
            try:
                opened = open_share(self.tag, self.params, e, key,
                                    vss.Commitments.from_bytes(c.seed, self.params.threshold),
                                    vss.Commitments.from_bytes(c.key, self.params.threshold))
            except ValueError as exc:  # malformed commitments: signed by the dealer, so its fault
                opened = str(exc)
            if isinstance(opened, str):
                complaints.append(Complaint(e.sender, key))
            else:
                held[e.sender] = opened
        self._held, self._delivered = held, frozenset(senders)
        self.stage = "mask"
        return ShareCheck(self.client, self.params.round, tuple(complaints))

    def mask(self, verdict: ShareVerdict, vector: np.ndarray, num_examples: int) -> MaskedInput:
        """Stage 4: leave out the clients the server excluded, then quantise `vector` (the flat update), weight it
        by its public weight min(num_examples, W), and mask it with the self mask and one pairwise mask per
        neighbour still in the round."""
        self._expect("mask", verdict.round)
        out = set(verdict.excluded)
        if self.client in out:
            raise self._refuse("the server left this client out of the round after the share check")
        partners = frozenset(self._delivered - out)
        if len(partners) + 1 < self.params.threshold:
            raise self._refuse(f"only {len(partners)} of its neighbours are left in the round; its secrets need "
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
        weight = q.weight(int(num_examples))
        words = q.encode_vector(vec, weight)
        streams = crypto.Keystreams(words.size, q.dtype)
        words += streams.words(self._seed)
        for peer in sorted(partners):
            s = crypto.agree(self._mask_sk, self._roster[peer].mask_pk,
                             crypto.pair_info(MASK_PURPOSE, self.tag, self.client, peer))
            if mask_sign(self.client, peer) > 0:
                words += streams.words(s)
            else:
                words -= streams.words(s)
        self._partners = partners
        self._held = {o: v for o, v in self._held.items() if o not in out}
        self.stage = "consistency"
        return MaskedInput(self.client, self.params.round, words, weight,
                           self.signer.sign(weight_statement(self.tag, self.client, weight)),
                           version=self.params.version)

    def _survivors_among_holders(self, survivors: tuple[str, ...]) -> set[str]:
        everyone = set(self.params.clients)
        if (not isinstance(survivors, tuple) or len(set(survivors)) != len(survivors)
                or not set(survivors) <= everyone or list(survivors) != sorted(survivors)):
            raise self._refuse("the survivor set is not a sorted list of distinct clients of the round")
        if self.client not in survivors:
            raise self._refuse("the survivor set leaves this client out; its masked input must not be counted")
        alive = set(survivors) & (self._partners | {self.client})
        if len(alive) < self.params.threshold:
            raise self._refuse(f"only {len(alive)} of its share holders survived, fewer than the threshold "
                               f"{self.params.threshold}; the sum of so few would expose them")
        return alive

    def sign_survivors(self, request: SurvivorSet) -> SurvivorSignature:
        """Stage 5 (consistency): sign the survivor set, once a round; nothing is revealed yet."""
        self._expect("consistency", request.round)
        self._survivors_among_holders(request.survivors)
        self.survivors, self.stage = request.survivors, "unmask"
        return SurvivorSignature(self.client, self.params.round, self.signer.sign(
            survivors_statement(self.tag, self.client, request.survivors)))

    def unmask(self, request: UnmaskRequest) -> UnmaskResponse:
        """Stage 6: seed shares of the survivors, key shares of the dropped, among the clients whose checked shares
        it holds; only for the set it signed, with at least the threshold of its holders' signatures on that same
        set, and never twice for one round or one model."""
        self._expect("unmask", request.round)
        if request.survivors != self.survivors:
            raise self._refuse("the unmask request names another survivor set than the one this client signed: the "
                               "combiner tells clients different stories; nothing is revealed")
        alive = self._survivors_among_holders(request.survivors)
        if len(request.signatures) > len(self._partners):
            raise self._refuse(f"{len(request.signatures)} signatures for {len(self._partners)} share holders")
        good = {self.client}
        for signer, sig in request.signatures:
            if signer == self.client or signer not in alive or signer in good:
                raise self._refuse(f"a survivor-set signature of {signer!r}, not one survivor among its holders once")
            k = self._roster[signer]
            why = self.verifier.refusal(signer, k.chain, survivors_statement(self.tag, signer, self.survivors), sig)
            if why is not None:
                raise self._refuse(f"the survivor-set signature of {signer!r} does not verify ({why}); the sets "
                                   "do not agree, nothing is revealed")
            good.add(signer)
        if len(good) < self.params.threshold:
            raise self._refuse(f"only {len(good)} of its share holders (itself included) signed the survivor set, "
                               f"fewer than the threshold {self.params.threshold}; nothing is revealed")
        why = self.journal.refusal(self.params.round, self.params.model)
        if why is not None:
            raise self._refuse(why)
        self.journal.record(self.params.round, self.params.model)  # before any share leaves
        live = set(request.survivors)
        self.stage = "done"
        return UnmaskResponse(self.client, self.params.round,
                              tuple((o, self._held[o][0]) for o in sorted(self._held) if o in live),
                              tuple((o, self._held[o][1]) for o in sorted(self._held) if o not in live))
