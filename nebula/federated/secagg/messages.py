"""SecAgg+ round parameters and the typed messages of its stages, as frozen dataclasses (the active-adversary
variant: signed keys, verifiable shares and a consistency check of the survivor set, Bonawitz et al. 2017 §4).

Stage                 client -> server                     server -> client
1 advertise keys      AdvertiseKeys (signed)               KeyRoster (its neighbours' signed keys)
2 share keys          ShareKeys (sealed shares, signed     ShareDelivery (the shares sealed for it, with their
                      Feldman commitments)                 dealers' signed commitments)
3 check shares        ShareCheck (complaints: a dealer     ShareVerdict (who is out of the round: dealers proven
                      and the key of its one share)        bad, false complainers, too few valid holders)
4 masked input        MaskedInput (signed public weight)   SurvivorSet (who sent a masked input)
5 consistency         SurvivorSignature                    UnmaskRequest (the set, with the signatures of the
                                                           receiver's neighbours that signed it)
6 unmask              UnmaskResponse                       -- the server checks each share it uses against the
                                                           owner's commitments and computes the SecureSum

They are the messages on the wire too (nebula.messaging.protocol), in two families: `TO_SERVER` (`sa_keys`,
`sa_shares`, `sa_check`, `sa_masked`, `sa_signed`, `sa_reveal`) and `TO_CLIENT` (`sa_roster`, `sa_delivery`,
`sa_verdict`, `sa_survivors`, `sa_unmask`), which a runtime includes in the families its roles receive
(nebula.federated.messages). A client's message names the client (`client`): its server refuses one that names
another than the channel it came on. The server's name the receiving process (`to`, for the runtime to fill in).
The Feldman commitments travel in the raw part after the header (`raw_field`), not as base64 text; a masked input's
words never travel in its header (`local_field`): they follow as a model of one tensor, and the receiver puts them
in.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from nebula.federated.secagg.graph import majority_threshold
from nebula.federated.secagg.quantize import Quantizer
from nebula.messaging.protocol import Message, MessageFamily, Untrusted, local_field, raw_field

__all__ = ["SecAggRefused", "SecAggParams", "AdvertiseKeys", "KeyRoster", "EncryptedShare", "DealerCommitments",
           "ShareKeys", "ShareDelivery", "Complaint", "ShareCheck", "ShareVerdict", "MaskedInput", "SurvivorSet",
           "SurvivorSignature", "UnmaskRequest", "UnmaskResponse",
           "SecureSum", "MIN_CLIENTS", "model_digest", "TO_SERVER", "TO_CLIENT"]

TO_SERVER = MessageFamily("secagg server")  # what a client sends its server (a combiner), stage by stage
TO_CLIENT = MessageFamily("secagg client")  # the server's answers at the end of each stage

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
    vector_length: int  # parameters in the flattened update: one masked word each
    quantizer: Quantizer
    version: int = 0  # the model version the round trains, as the task names it
    model: bytes = bytes(32)  # SHA-256 of that model as the client received it (`model_digest`)

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
        if not majority_threshold(k) <= self.threshold <= k + 1:
            raise ValueError(f"secure_aggregation.threshold={self.threshold} must be between "
                             f"{majority_threshold(k)} (a majority of the {k + 1} holders, so no server gets both "
                             f"shares of a client) and the {k + 1} holders")
        if len(self.model) != 32:
            raise ValueError(f"secure aggregation model digest is {len(self.model)} bytes; use model_digest")
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
                          str(q.max_weight), str(q.word_bits), str(self.version), self.model.hex()])
        return hashlib.sha256(text.encode()).digest()

    def point(self, client: str) -> int:
        """The Shamir x-coordinate of `client`'s shares: its 1-based place in the round's list."""
        return self.clients.index(client) + 1


def model_digest(weights) -> bytes:
    """SHA-256 of a model (name, dtype, shape and bytes of each tensor, in order): the round's tag binds it, and a
    client reveals shares for one round on a model at most once."""
    h = hashlib.sha256(b"nebula secagg+ model")
    for name, value in weights.items():
        a = np.ascontiguousarray(value)
        h.update(f"{name}\0{a.dtype.str}\0{a.shape}\0".encode())
        h.update(memoryview(a).cast("B"))
    return h.digest()


@TO_SERVER.message("sa_keys")
@dataclass(frozen=True, slots=True)
class AdvertiseKeys(Message):
    """Stage 1: a client's two fresh X25519 public keys (one to seal shares, one for pairwise masks), signed with
    its certificate's key over the round's tag (`vouch`); `chain` is that certificate (PEM)."""

    client: str
    round: int
    cipher_pk: bytes
    mask_pk: bytes
    chain: bytes = b""
    signature: bytes = b""

    @property
    def payload_bytes(self) -> int:
        return len(self.cipher_pk) + len(self.mask_pk) + len(self.chain) + len(self.signature)


@TO_CLIENT.message("sa_roster")
@dataclass(frozen=True, slots=True)
class KeyRoster(Message):
    """Stage 1 answer: the advertised keys of the receiver and of its neighbours that advertised."""

    round: int
    keys: tuple[AdvertiseKeys, ...]
    to: str | None = None

    @property
    def payload_bytes(self) -> int:
        return sum(k.payload_bytes for k in self.keys)


@dataclass(frozen=True, slots=True)
class EncryptedShare:
    """A sender's shares of its self-mask seed and mask key, sealed for one receiver (the server relays it);
    `key_check`: the sender's hash of the one key it sealed them under (`client.share_key_check`), which lets the
    server settle a complaint about this share."""

    sender: str
    receiver: str
    ciphertext: bytes
    key_check: bytes = b""


@dataclass(frozen=True, slots=True)
class DealerCommitments:
    """A dealer's Feldman commitments (`vss.Commitments.to_bytes`, threshold values each) to the polynomials of its
    self-mask seed and of its mask key, signed with its certificate's key over the round's tag and its name."""

    dealer: str
    seed: bytes = raw_field()  # (the bulk of stage 2: in the raw part after the header)
    key: bytes = raw_field()
    signature: bytes

    @property
    def payload_bytes(self) -> int:
        return len(self.seed) + len(self.key) + len(self.signature)


@TO_SERVER.message("sa_shares")
@dataclass(frozen=True, slots=True)
class ShareKeys(Message):
    """Stage 2: the signed commitments of both secrets, and one sealed share per neighbour."""

    client: str
    round: int
    commitments: DealerCommitments
    shares: tuple[EncryptedShare, ...]

    @property
    def payload_bytes(self) -> int:
        return self.commitments.payload_bytes + sum(len(s.ciphertext) + len(s.key_check) for s in self.shares)


@TO_CLIENT.message("sa_delivery")
@dataclass(frozen=True, slots=True)
class ShareDelivery(Message):
    """Stage 2 answer: the shares sealed for the receiver by its neighbours that completed stage 2, and each of those
    dealers' signed commitments."""

    round: int
    shares: tuple[EncryptedShare, ...]
    commitments: tuple[DealerCommitments, ...] = ()
    to: str | None = None

    @property
    def payload_bytes(self) -> int:
        return sum(len(s.ciphertext) for s in self.shares) + sum(c.payload_bytes for c in self.commitments)


@dataclass(frozen=True, slots=True)
class Complaint:
    """A receiver's evidence against a dealer: the key of the one share the dealer sealed for it (that key opens
    nothing else), so the server opens the share and checks it against the dealer's commitments itself."""

    dealer: str
    key: bytes


@TO_SERVER.message("sa_check")
@dataclass(frozen=True, slots=True)
class ShareCheck(Message):
    """Stage 3: the receiver checked every share it was delivered; a complaint for each that failed."""

    client: str
    round: int
    complaints: tuple[Complaint, ...] = ()


@TO_CLIENT.message("sa_verdict")
@dataclass(frozen=True, slots=True)
class ShareVerdict(Message):
    """Stage 3 answer: the clients left out of the round before any masked input (nobody masks with them)."""

    round: int
    excluded: tuple[str, ...]
    to: str | None = None


@TO_SERVER.message("sa_masked")
@dataclass(frozen=True, slots=True, eq=False)
class MaskedInput(Message):
    """Stage 4: the masked words (one per parameter, uniform to anyone without the masks) and the client's public
    weight min(n_i, W), signed with its certificate's key over the round's tag and its name.

    On the wire the words follow the header as the one tensor of a model (pushed inline when `pushed`, else when
    the server pulls them), so a server checks the header before it takes a byte of them; `job` and `version` name
    the job and the model the round trains, `metrics` the client's evaluation of that model (kept as sent: the
    receiver bounds it)."""

    client: str
    round: int
    words: np.ndarray | None = local_field()
    weight: int = 1
    signature: bytes = b""
    job: str = ""
    version: int = 0
    metrics: Untrusted = None
    pushed: bool = False

    @property
    def payload_bytes(self) -> int:
        return int(self.words.nbytes) + 8 + len(self.signature)


@TO_CLIENT.message("sa_survivors")
@dataclass(frozen=True, slots=True)
class SurvivorSet(Message):
    """Stage 4 answer: every client whose masked input the server took; each survivor signs it."""

    round: int
    survivors: tuple[str, ...]
    to: str | None = None


@TO_SERVER.message("sa_signed")
@dataclass(frozen=True, slots=True)
class SurvivorSignature(Message):
    """Stage 5: a survivor's signature over the round's tag and the survivor set it was sent."""

    client: str
    round: int
    signature: bytes


@TO_CLIENT.message("sa_unmask")
@dataclass(frozen=True, slots=True)
class UnmaskRequest(Message):
    """Stage 5 answer: the survivor set, and (signer, signature) of the receiver's share holders that signed it;
    the receiver reveals its shares only when at least the threshold of them agree with the set it signed."""

    round: int
    survivors: tuple[str, ...]
    signatures: tuple[tuple[str, bytes], ...]
    to: str | None = None


@TO_SERVER.message("sa_reveal")
@dataclass(frozen=True, slots=True)
class UnmaskResponse(Message):
    """Stage 6: the receiver's shares of the survivors' self-mask seeds and of the dropped clients' mask keys."""

    client: str
    round: int
    seed_shares: tuple[tuple[str, bytes], ...]
    key_shares: tuple[tuple[str, bytes], ...]

    @property
    def payload_bytes(self) -> int:
        return sum(len(s) for _, s in self.seed_shares) + sum(len(s) for _, s in self.key_shares)


@dataclass(frozen=True, slots=True, eq=False)
class SecureSum:
    """What a combiner learns: the survivors' sum of w_i·clip(x_i), their public weights' total, and who took part."""

    round: int
    vector: np.ndarray  # float64, Σ min(n_i, W)/W · clip(x_i)
    num_examples: int  # Σ min(n_i, W): the survivors' signed public weights
    max_weight: int  # W: the mean is vector · W / num_examples
    survivors: tuple[str, ...]
    dropped: tuple[str, ...]
    error_bound: float  # per coordinate of `vector`, from the fixed-point rounding
