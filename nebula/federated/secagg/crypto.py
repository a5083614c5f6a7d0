"""The primitives SecAgg+ uses, all from `cryptography`: X25519 key agreement with HKDF-SHA256, AES-256-GCM for the
shares sent between neighbours through the server, and an AES-256-CTR keystream as the mask generator.

Every derived key is bound by the HKDF `info` to its purpose, the round's parameter tag and the ordered pair of
clients, so a key never serves two purposes, two rounds or two pairs. A mask key expands to one keystream only
(nonce 0 is safe because the key is used once).
"""
from __future__ import annotations

import os
from typing import Callable

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

__all__ = ["KEY_BYTES", "NONCE_BYTES", "TAG_BYTES", "keypair", "public_key", "usable_public_key", "agree", "pair_info",
           "seal", "unseal", "prg", "Keystreams", "AuthenticationError"]

KEY_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16


class AuthenticationError(ValueError):
    """A sealed share failed authentication: tampered, misaddressed, or sealed under another key."""


def keypair(random_bytes: Callable[[int], bytes] = os.urandom) -> tuple[bytes, bytes]:
    """A fresh X25519 (private, public) key pair as raw 32-byte strings."""
    sk = random_bytes(KEY_BYTES)
    return sk, public_key(sk)


def public_key(private: bytes) -> bytes:
    """The X25519 public key of a raw private key (the server checks a reconstructed key against it)."""
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    return X25519PrivateKey.from_private_bytes(private).public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def usable_public_key(key: bytes) -> bool:
    """Whether `key` is 32 bytes and not a low-order point (whose shared secret is all zeros for every peer)."""
    if len(key) != KEY_BYTES:
        return False
    try:
        X25519PrivateKey.from_private_bytes(bytes(range(1, 33))).exchange(X25519PublicKey.from_public_bytes(key))
    except ValueError:
        return False
    return True


def pair_info(purpose: bytes, tag: bytes, a: str, b: str) -> bytes:
    """HKDF info for the pair {a, b}: the same from both ends (names in sorted order), length-prefixed."""
    lo, hi = sorted((a, b))
    parts = [purpose, tag, lo.encode(), hi.encode()]
    return b"".join(len(p).to_bytes(2, "big") + p for p in parts)


def agree(private: bytes, peer_public: bytes, info: bytes) -> bytes:
    """A 32-byte key both ends derive: HKDF-SHA256 of the X25519 shared secret with `info`.

    ValueError for a peer key that is not 32 bytes or is a low-order point (all-zero shared secret)."""
    if len(peer_public) != KEY_BYTES:
        raise ValueError(f"an X25519 public key is {KEY_BYTES} bytes, got {len(peer_public)}")
    shared = X25519PrivateKey.from_private_bytes(private).exchange(X25519PublicKey.from_public_bytes(peer_public))
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=info).derive(shared)


def seal(key: bytes, plaintext: bytes, aad: bytes, random_bytes: Callable[[int], bytes] = os.urandom) -> bytes:
    """nonce || AES-256-GCM(plaintext) with `aad` authenticated (who sends it to whom, in which round)."""
    nonce = random_bytes(NONCE_BYTES)
    return nonce + AESGCM(key).encrypt(nonce, plaintext, aad)


def unseal(key: bytes, blob: bytes, aad: bytes) -> bytes:
    """The plaintext of `seal`; AuthenticationError when the blob or its `aad` was altered."""
    if len(blob) < NONCE_BYTES + TAG_BYTES:
        raise AuthenticationError(f"a sealed share is at least {NONCE_BYTES + TAG_BYTES} bytes, got {len(blob)}")
    try:
        return AESGCM(key).decrypt(blob[:NONCE_BYTES], blob[NONCE_BYTES:], aad)
    except InvalidTag:
        raise AuthenticationError("a sealed share failed authentication") from None


def prg(seed: bytes, count: int, dtype: np.dtype) -> np.ndarray:
    """`count` uniform words of unsigned `dtype` from the AES-256-CTR keystream of `seed` (32 bytes)."""
    return Keystreams(count, dtype).words(seed)


class Keystreams:
    """`prg`'s words for many seeds of one length, written into the same buffers one after the other: a mask is
    added as soon as it is made, and fresh pages for every stream can cost as much as the cipher itself."""

    def __init__(self, count: int, dtype: np.dtype) -> None:
        self.dtype = np.dtype(dtype)
        n = count * self.dtype.itemsize
        self._zeros = np.zeros(n, np.uint8)
        self._out = np.empty(n + 15, np.uint8)  # update_into wants room for a block more than it writes

    def words(self, seed: bytes) -> np.ndarray:
        """The words of `seed`'s keystream: a view that the next call overwrites."""
        enc = Cipher(algorithms.AES(seed), modes.CTR(bytes(16))).encryptor()
        written = enc.update_into(self._zeros, self._out)
        return self._out[:written].view(self.dtype)
