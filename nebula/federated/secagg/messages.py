"""SecAgg+ round parameters and the typed messages of its four stages, as frozen dataclasses.

Stage                 client -> server            server -> client
1 advertise keys      AdvertiseKeys               KeyRoster (its neighbours' keys)
2 share keys          ShareKeys (sealed shares)   ShareDelivery (the shares sealed for it)
3 masked input        MaskedInput                 UnmaskRequest (which neighbours survived, which dropped)
4 unmask              UnmaskResponse              -- the server computes the SecureSum
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from nebula.federated.secagg.graph import majority_threshold
from nebula.federated.secagg.quantize import Quantizer

__all__ = ["SecAggRefused", "SecAggParams", "AdvertiseKeys", "KeyRoster", "EncryptedShare", "ShareKeys",
           "ShareDelivery", "MaskedInput", "UnmaskRequest", "UnmaskResponse", "SecureSum", "MIN_CLIENTS"]

MIN_CLIENTS = 3  # with two, a majority of a dropped client's one neighbour is two: never recoverable


class SecAggRefused(Exception):
    """A message or request refused by the protocol; `str(exc)` is the one-line reason for the audit record."""


@dataclass(frozen=True, slots=True)
class SecAggParams:
    """What every party of one round agrees on; the clients check it before they take part."""

    round: int
    session: bytes  # fresh random bytes from the server each round: keys and masks never repeat across rounds
    clients: tuple[str, ...]
    degree: int  # neighbours per client; >= len(clients) - 1 means everyone (the original SecAgg)
    threshold: int  # shares that recover a secret; a majority of the degree + 1 holders at least
    vector_length: int  # parameters in the flattened update (the masked vector has one more word: the count)
    quantizer: Quantizer

    def __post_init__(self) -> None:
        n = len(self.clients)
        if n < MIN_CLIENTS:
            raise ValueError(f"secure aggregation needs at least {MIN_CLIENTS} clients in a round, got {n}; a "
                             "combiner with fewer cannot hide one client's update in a sum")
        if len(set(self.clients)) != n or not all(isinstance(c, str) and c for c in self.clients):
            raise ValueError("secure aggregation clients must be distinct non-empty names")
        if len(self.session) < 16:
            raise ValueError(f"secure aggregation session is {len(self.session)} bytes; use 16 random bytes")
        k = self.effective_degree
        if k < 2 or (k < n - 1 and k % 2):
            raise ValueError(f"secure_aggregation.degree={self.degree} must be even and >= 2 (or >= {n - 1})")
        if not majority_threshold(k) <= self.threshold <= k:
            raise ValueError(f"secure_aggregation.threshold={self.threshold} must be between "
                             f"{majority_threshold(k)} (a majority of the {k + 1} holders, so no server gets both "
                             f"shares of a client) and the degree {k}")
        if self.vector_length < 1:
            raise ValueError(f"secure aggregation vector_length={self.vector_length} must be >= 1")
        if self.quantizer.max_clients < n:
            raise ValueError(f"secure aggregation quantizer sized for {self.quantizer.max_clients} clients, the "
                             f"round has {n}; its sum could overflow")

    @property
    def effective_degree(self) -> int:
        """The degree actually used: at most n − 1."""
        return min(self.degree, len(self.clients) - 1)

    def tag(self) -> bytes:
        """SHA-256 of every parameter: bound into each derived key, so parties with different views disagree."""
        q = self.quantizer
        text = "\n".join([str(self.round), self.session.hex(), *self.clients, str(self.effective_degree),
                          str(self.threshold), str(self.vector_length), repr(q.clip_range), str(q.max_clients),
                          str(q.max_weight), str(q.word_bits)])
        return hashlib.sha256(text.encode()).digest()

    def point(self, client: str) -> int:
        """The Shamir x-coordinate of `client`'s shares: its 1-based place in the round's list."""
        return self.clients.index(client) + 1


@dataclass(frozen=True, slots=True)
class AdvertiseKeys:
    """Stage 1: a client's two fresh X25519 public keys (one to seal shares, one for pairwise masks)."""

    client: str
    round: int
    cipher_pk: bytes
    mask_pk: bytes

    @property
    def payload_bytes(self) -> int:
        return len(self.cipher_pk) + len(self.mask_pk)


@dataclass(frozen=True, slots=True)
class KeyRoster:
    """Stage 1 answer: the advertised keys of the receiver and of its neighbours that advertised."""

    round: int
    keys: tuple[AdvertiseKeys, ...]

    @property
    def payload_bytes(self) -> int:
        return sum(k.payload_bytes for k in self.keys)


@dataclass(frozen=True, slots=True)
class EncryptedShare:
    """A sender's shares of its self-mask seed and mask key, sealed for one receiver (the server relays it)."""

    sender: str
    receiver: str
    ciphertext: bytes


@dataclass(frozen=True, slots=True)
class ShareKeys:
    """Stage 2: one sealed share per neighbour, and a hash commitment to the self-mask seed."""

    client: str
    round: int
    seed_commitment: bytes
    shares: tuple[EncryptedShare, ...]

    @property
    def payload_bytes(self) -> int:
        return len(self.seed_commitment) + sum(len(s.ciphertext) for s in self.shares)


@dataclass(frozen=True, slots=True)
class ShareDelivery:
    """Stage 2 answer: the shares sealed for the receiver by its neighbours that completed stage 2."""

    round: int
    shares: tuple[EncryptedShare, ...]

    @property
    def payload_bytes(self) -> int:
        return sum(len(s.ciphertext) for s in self.shares)


@dataclass(frozen=True, slots=True, eq=False)
class MaskedInput:
    """Stage 3: the masked words (update then count), uniform to anyone without the masks."""

    client: str
    round: int
    words: np.ndarray

    @property
    def payload_bytes(self) -> int:
        return int(self.words.nbytes)


@dataclass(frozen=True, slots=True)
class UnmaskRequest:
    """Stage 3 answer: among the receiver's neighbours, who sent a masked input and who did not."""

    round: int
    survivors: tuple[str, ...]
    dropped: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class UnmaskResponse:
    """Stage 4: the receiver's shares of the survivors' self-mask seeds and of the dropped clients' mask keys."""

    client: str
    round: int
    seed_shares: tuple[tuple[str, bytes], ...]
    key_shares: tuple[tuple[str, bytes], ...]

    @property
    def payload_bytes(self) -> int:
        return sum(len(s) for _, s in self.seed_shares) + sum(len(s) for _, s in self.key_shares)


@dataclass(frozen=True, slots=True, eq=False)
class SecureSum:
    """What a combiner learns: the survivors' sum of w_i·clip(x_i) and of their counts, and who took part."""

    round: int
    vector: np.ndarray  # float64, Σ min(n_i, W)/W · clip(x_i)
    num_examples: int  # Σ min(n_i, W)
    max_weight: int  # W: the mean is vector · W / num_examples
    survivors: tuple[str, ...]
    dropped: tuple[str, ...]
    error_bound: float  # per coordinate of `vector`, from the fixed-point rounding
