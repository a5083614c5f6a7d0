"""Shamir secret sharing of 32-byte secrets over the prime field GF(2^521 − 1).

Why this field: every secret shared here (an X25519 private key, a self-mask seed) is 256 random bits, so the
field must hold 2^256 values; the Mersenne prime 2^521 − 1 is the smallest classical, table-free prime above that
(its primality is Lucas-Lehmer-proved since 1952; it is also the field of NIST P-521), so a secret is one field
element, never split, and a share is one 66-byte element. Any `threshold` shares give the secret by Lagrange
interpolation at 0; fewer are consistent with every secret (perfect secrecy), so they give nothing.
"""
from __future__ import annotations

import os
from typing import Callable, Sequence

__all__ = ["PRIME", "SHARE_BYTES", "SECRET_BYTES", "split", "combine", "polynomial", "evaluate_polynomial"]

PRIME = 2 ** 521 - 1
SHARE_BYTES = 66  # ceil(521 / 8)
SECRET_BYTES = 32


def _element(random_bytes: Callable[[int], bytes]) -> int:
    # 80 bytes reduced mod a 521-bit prime: the bias from uniform is below 2^-118
    return int.from_bytes(random_bytes(80), "big") % PRIME


def polynomial(secret: bytes, threshold: int, xs: Sequence[int],
               random_bytes: Callable[[int], bytes] = os.urandom) -> list[int]:
    """The coefficients (constant term first: the secret) of a fresh random polynomial of degree threshold − 1,
    after checking the arguments of a split: what `split` and the verifiable split share."""
    if len(secret) != SECRET_BYTES:
        raise ValueError(f"a shared secret is {SECRET_BYTES} bytes, got {len(secret)}")
    if not 1 <= threshold <= len(xs):
        raise ValueError(f"threshold {threshold} must be between 1 and the {len(xs)} share holders")
    if len(set(xs)) != len(xs) or not all(0 < x < PRIME for x in xs):
        raise ValueError("share points must be distinct and nonzero")
    return [int.from_bytes(secret, "big")] + [_element(random_bytes) for _ in range(threshold - 1)]


def evaluate_polynomial(coeffs: Sequence[int], xs: Sequence[int]) -> list[bytes]:
    """The shares: the polynomial `coeffs` at each of `xs`, as SHARE_BYTES-byte elements."""
    out = []
    for x in xs:
        y = 0
        for c in reversed(coeffs):  # Horner
            y = (y * x + c) % PRIME
        out.append(y.to_bytes(SHARE_BYTES, "big"))
    return out


def split(secret: bytes, threshold: int, xs: Sequence[int],
          random_bytes: Callable[[int], bytes] = os.urandom) -> list[bytes]:
    """Shares of `secret` at the points `xs` (distinct, in 1..PRIME−1), any `threshold` of which recover it."""
    return evaluate_polynomial(polynomial(secret, threshold, xs, random_bytes), xs)


def combine(points: Sequence[tuple[int, bytes]]) -> bytes:
    """The secret at x = 0 of the polynomial through `points` ((x, share) pairs); with fewer points than the
    threshold this is a field element unrelated to the secret (reduced to 32 bytes, so callers must check it)."""
    if not points:
        raise ValueError("no shares to combine")
    xs = [x for x, _ in points]
    if len(set(xs)) != len(xs):
        raise ValueError("two shares at the same point")
    ys = [int.from_bytes(y, "big") for _, y in points]
    if any(len(y) != SHARE_BYTES for _, y in points) or any(y >= PRIME for y in ys):
        raise ValueError(f"a share is not a {SHARE_BYTES}-byte element of GF(2^521 - 1)")
    secret = 0
    for i, (xi, yi) in enumerate(zip(xs, ys)):
        num, den = 1, 1
        for j, xj in enumerate(xs):
            if j != i:
                num = num * xj % PRIME
                den = den * (xj - xi) % PRIME
        secret = (secret + yi * num * pow(den, -1, PRIME)) % PRIME
    # a wrong reconstruction is a random 521-bit element: keep its low 256 bits so it still has a secret's shape
    return (secret % (1 << (8 * SECRET_BYTES))).to_bytes(SECRET_BYTES, "big")
