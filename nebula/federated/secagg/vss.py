"""Feldman verifiable secret sharing over shamir.py's field: a share holder checks its share, and whoever rebuilds a
secret checks the result, against the dealer's commitments, so a wrong share is caught and its sender named.

The shares are Shamir shares over GF(q), q = 2^521 − 1 (the very shares `shamir.split` makes). The commitments
C_j = g^(a_j) mod p to the polynomial's coefficients a_j live in a Schnorr group: p = k·q + 1 prime, g of order q.
Share y at point x is right iff g^y = Π_j C_j^(x^j) (mod p); a secret s is the committed one iff g^s = C_0.

The group is found by `derive_group`, a deterministic search anyone can rerun: for counter = 0, 1, …, k is
SHAKE-256("nebula secagg+ feldman group v1" ‖ bits ‖ counter) cut to bits − 521 bits, its top two bits set (so
p = k·q + 1 has exactly `bits` bits) and its low bit cleared (so p is odd); the first p that passes trial division
and Miller-Rabin with the first 64 primes as bases is taken (counter 243 for 2048 bits), and g = 2^k mod p (≠ 1, so
of order exactly q, as q is prime). The result is hard-coded below; the tests re-derive it and check p with
`openssl prime`.

Security: binding rests on discrete logs in the order-q subgroup. Unlike bare Shamir shares, C_0 = g^secret is
public, so hiding is computational: a 2048-bit p gives about 112-bit security (NIST SP 800-57), below X25519's
128; `derive_group(3072)` gives 128 bits at about 2.2× the cost of every exponentiation.

Speed: g^y uses a fixed-base table (8-bit windows, built once on first use: about 5 MB, 0.2 s) and Π_j C_j^(x^j) is
computed by Horner's rule in the exponent, ((C_{t−1}^x · C_{t−2})^x · …)^x · C_0, whose exponent x is a holder's
small index: a check costs about 66 + t·(log2 x + 1) multiplications mod p instead of t + 1 full exponentiations.
The arithmetic mod p is GMP's (gmpy2): a 2048-bit product mod p takes about a seventh of Python's own integers' time
(`benchmarks/secagg.py --only pure` prints the share check's time); values cross this module's API as Python ints.

Why received commitments are only range-checked (1 < v < p), not tested for membership of the order-q subgroup
(v^q = 1, a full exponentiation per value: 0.35 s per dealer at t = 32): p − 1 = k·q with q ∤ k, so Z_p* is the
direct product G_q × G_k and every C_j splits uniquely as g^(a_j) · h_j with h_j of order dividing k. A share y at x
passes iff g^y = Π_j C_j^(x^j) = g^(Σ a_j x^j) · Π_j h_j^(x^j); the left side lies in G_q, so by the uniqueness of
the decomposition it passes iff y ≡ Σ a_j x^j (mod q) and Π_j h_j^(x^j) = 1. Whatever order-k parts a dealer puts
in, every share that passes is the value at x of the one polynomial Σ a_j X^j, pinned by the commitments: any t
shares that pass rebuild the same secret a_0. If that polynomial is not the one the dealer shared (or C_0 has an
order-k part, h_0 ≠ 1), honest holders' shares fail and the dealer is blamed, or the rebuilt secret fails
`verify_secret` (g^(a_0) ≠ C_0), which blames the dealer too. So the subgroup test adds no soundness to the checks
made here (tests/federated/test_secagg_vss.py plants an order-2 component to show it).
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Sequence

import gmpy2

from nebula.federated.secagg import shamir

__all__ = ["Q", "P", "G", "P_BITS", "ELEMENT_BYTES", "GROUP_LABEL", "GROUP_COUNTER", "Group", "Commitments",
           "split_verifiable", "verify_share", "verify_secret", "derive_group", "is_probable_prime"]

Q = shamir.PRIME  # 2^521 − 1: the order of g, and the field of the shares
GROUP_LABEL = b"nebula secagg+ feldman group v1"
P_BITS = 2048
GROUP_COUNTER = 243  # the search's first hit for P_BITS (tests re-derive it)
P = int(
    "c049a22e7559289feba0480d612cbd08c81a9cf04cfa7c4796ace5866e74ef89ff42655d61943ce83f562da3a4eacfa476e1990f5b17"
    "ccae46040c227f8c0aae9daa4e16019ef217f42f992cdfe46cc79816979113c9eb0866d0bd177fea85731e8ff495fa9816793cc196df"
    "854bbbd14bc2a4cf427fb103e69f942f8461bf84ebdc97d46318d6d594b53bc1e6dbe308f85959e6fc6c1f94579a2e4f80c55d03c1b8"
    "6a9536c4cf11943cfa278f35f0e9a7b00121ea720bde011db60184880f3d3ade6a317914ad5e2d8a9458c4b858693aba4c346349e6f4"
    "1bc29041d35d0c890e246ae6cff273463f0ff54a9bbacf3ffedde07fe9a3d46ec1c4e1b459b05691", 16)
G = int(
    "b5af26dccccbd6537370318a976e8a9f8bedea35cca1fc11ab5ac3ce7f987a301377ca350b91433e8762b83b62f4d0a99f427943aae8"
    "bbed162a9c51695e61b2f3cdb91add56da94359c1c33e6021c43ce9967044d70927c4f672a2c0cdb7bf0514cfa8e11c7a20d8048cbb1"
    "43d51d01e6f35ce1f2cb09db5b6ee22cee329ba20991642a9dcd28d40310479084ea395eb4471eb60000a17fee02e8419b988b693f8d"
    "dd020e731e7384d40b2be668b4e20196b7d0cd0c0aebaa1fae70202fb2cb78bf6cd9b822fd9d92b09877bd9e40305c9d7aa18f30579b"
    "f490344f8828098dab2fdad0c34627055de77ac71ae0f024445c840f2e07a1377241e4f6599e0ac", 16)
ELEMENT_BYTES = (P_BITS + 7) // 8  # one commitment value on the wire
WINDOW_BITS = 8  # fixed-base table: ceil(521/8) = 66 rows of 256 powers of g (a quarter fewer products than 6)
_P = gmpy2.mpz(P)  # (GMP's integers for the group's arithmetic)


def _odd_primes_below(n: int) -> tuple[int, ...]:
    sieve = bytearray([1]) * n
    sieve[:2] = b"\0\0"
    for i in range(2, int(n ** 0.5) + 1):
        if sieve[i]:
            sieve[i * i::i] = bytes(len(range(i * i, n, i)))
    return tuple(i for i in range(3, n) if sieve[i])


_SMALL_PRIMES = _odd_primes_below(20000)  # trial divisors of a candidate p
MR_BASES = (2,) + _SMALL_PRIMES[:63]  # the first 64 primes


def is_probable_prime(n: int, bases: Sequence[int] = MR_BASES) -> bool:
    """Miller-Rabin with each of `bases` (a composite passes one random base with probability ≤ 1/4)."""
    if n < 2 or n % 2 == 0:
        return n == 2
    d, s = n - 1, 0
    while d % 2 == 0:
        d, s = d // 2, s + 1
    for a in bases:
        if a % n == 0:
            continue
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


@dataclass(frozen=True, slots=True)
class Group:
    """A Schnorr group over q = 2^521 − 1: p = k·q + 1 prime, g of order q; `counter` reproduces it."""

    counter: int
    k: int
    p: int
    g: int


def derive_group(bits: int = P_BITS, label: bytes = GROUP_LABEL) -> Group:
    """The deterministic search the module docstring describes (about 2 s for 2048 bits, 5 s for 3072)."""
    kb = bits - Q.bit_length()
    if kb < 2:
        raise ValueError(f"a group of {bits} bits leaves no room above q's {Q.bit_length()} bits")
    counter = 0
    while True:
        h = hashlib.shake_256(label + bits.to_bytes(2, "big") + counter.to_bytes(4, "big")).digest((kb + 7) // 8)
        k = ((int.from_bytes(h, "big") >> (-kb % 8)) | (3 << (kb - 2))) & ~1
        p = k * Q + 1
        # trial division first: it discards most candidates for far less than one Miller-Rabin round
        if p.bit_length() == bits and all(p % s for s in _SMALL_PRIMES) and is_probable_prime(p):
            g = pow(2, k, p)
            if g != 1:  # q is prime, so any g ≠ 1 with g^q = 1 has order q
                return Group(counter, k, p, g)
        counter += 1


@lru_cache(maxsize=1)
def _g_table() -> tuple[tuple["gmpy2.mpz", ...], ...]:
    # row i holds g^(d · 2^(8i)) for d < 256: g^e is then one product of ≤ 66 table entries, no squarings
    rows, base = [], gmpy2.mpz(G)
    for _ in range(-(-Q.bit_length() // WINDOW_BITS)):
        row = [gmpy2.mpz(1)]
        for _ in range((1 << WINDOW_BITS) - 1):
            row.append(row[-1] * base % _P)
        rows.append(tuple(row))
        base = row[-1] * base % _P
    return tuple(rows)


def _g_pow(e: int) -> "gmpy2.mpz":
    """g^e mod p for 0 ≤ e < 2^522 (fixed-base windows)."""
    acc, mask = gmpy2.mpz(1), (1 << WINDOW_BITS) - 1
    for row in _g_table():
        if not e:
            break
        d = e & mask
        if d:
            acc = acc * row[d] % _P
        e >>= WINDOW_BITS
    return acc


@dataclass(frozen=True, slots=True)
class Commitments:
    """A dealer's commitments g^(a_j) mod p to its polynomial's coefficients, constant term (the secret's) first."""

    values: tuple[int, ...]

    def __post_init__(self) -> None:
        # a range check only: the subgroup test is not needed for soundness (module docstring)
        if not self.values or not all(type(v) is int and 2 <= v < P for v in self.values):
            raise ValueError("commitments must be a non-empty tuple of integers in [2, p-1]")

    @property
    def threshold(self) -> int:
        """The shares that rebuild the secret: one more than the polynomial's degree."""
        return len(self.values)

    def to_bytes(self) -> bytes:
        """The values, each ELEMENT_BYTES big-endian, concatenated."""
        return b"".join(v.to_bytes(ELEMENT_BYTES, "big") for v in self.values)

    @classmethod
    def from_bytes(cls, data: bytes, threshold: int) -> "Commitments":
        """Parse exactly `threshold` values, each in [2, p-1]; else ValueError (no subgroup test: see the module's
        docstring for why the share and secret checks stay sound without it)."""
        if threshold < 1 or len(data) != threshold * ELEMENT_BYTES:
            raise ValueError(f"commitments are {len(data)} bytes, expected {threshold} x {ELEMENT_BYTES} for "
                             f"threshold {threshold}; the dealer must commit to every coefficient")
        values = tuple(int.from_bytes(data[i:i + ELEMENT_BYTES], "big") for i in range(0, len(data), ELEMENT_BYTES))
        for j, v in enumerate(values):
            if not 2 <= v < P:
                raise ValueError(f"commitment {j} is outside [2, p-1]; the dealer sent a malformed commitment")
        return cls(values)


def split_verifiable(secret: bytes, threshold: int, xs: Sequence[int],
                     random_bytes: Callable[[int], bytes] = os.urandom) -> tuple[list[bytes], Commitments]:
    """`shamir.split`'s shares of `secret` at `xs` and the commitments that let each holder check its own."""
    if len(secret) == shamir.SECRET_BYTES and not any(secret):
        raise ValueError("a verifiably shared secret must not be all zero bytes (its commitment would be 1); "
                         "share a random secret")
    coeffs = shamir.polynomial(secret, threshold, xs, random_bytes)
    return shamir.evaluate_polynomial(coeffs, xs), Commitments(tuple(int(_g_pow(a)) for a in coeffs))


def verify_share(x: int, share: bytes, commitments: Commitments) -> bool:
    """Whether `share` is the committed polynomial's value at point `x`."""
    if type(x) is not int or not 0 < x < Q or len(share) != shamir.SHARE_BYTES:
        return False
    y = int.from_bytes(share, "big")
    if y >= Q:
        return False
    vs = commitments.values
    acc = gmpy2.mpz(vs[-1])
    for c in reversed(vs[:-1]):  # Horner in the exponent: x is small, so each step is a short exponentiation
        acc = gmpy2.powmod(acc, x, _P) * c % _P
    return _g_pow(y) == acc


def verify_secret(secret: bytes, commitments: Commitments) -> bool:
    """Whether `secret` (e.g. a reconstruction) is the committed one: g^secret == C_0."""
    if len(secret) != shamir.SECRET_BYTES:
        return False
    return _g_pow(int.from_bytes(secret, "big")) == commitments.values[0]
