"""Feldman VSS over GF(2^521 − 1): the hard-coded group is the documented search's result and p is prime (our
Miller-Rabin and openssl's); shares are shamir's own and verify; a tampered share, a wrong point, a tampered
commitment fail, and an order-2 part in a commitment (parsed: no subgroup test) lets no wrong share pass;
a reconstruction is checked against C_0; from_bytes is strict."""
from __future__ import annotations

import random
import subprocess

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from nebula.federated.secagg import shamir, vss
from nebula.federated.secagg.vss import ELEMENT_BYTES, G, P, Q, Commitments


def seeded(seed: int):
    return random.Random(seed).randbytes


def dealt(t: int = 4, n: int = 7, seed: int = 1):
    rb = seeded(seed)
    secret = rb(32)
    xs = list(range(1, n + 1))
    shares, comm = vss.split_verifiable(secret, t, xs, rb)
    return secret, xs, shares, comm


def test_the_hard_coded_group_is_the_documented_search_result_and_p_is_prime():
    g = vss.derive_group()
    assert (g.counter, g.p, g.g) == (vss.GROUP_COUNTER, P, G)
    assert P.bit_length() == vss.P_BITS >= 2048 and (P - 1) % Q == 0 and g.k == (P - 1) // Q
    assert G != 1 and pow(G, Q, P) == 1  # q is prime, so g has order exactly q
    assert g.k % Q != 0  # q^2 does not divide p - 1: Z_p* splits into the order-q subgroup times one of order k
    assert vss.is_probable_prime(P) and vss.is_probable_prime(Q)
    out = subprocess.run(["openssl", "prime", "-hex", f"{P:x}"], capture_output=True, text=True, check=True).stdout
    assert out.strip().endswith("is prime"), out
    # the checker can say no: a Carmichael number, a product of two large primes, and the search's near misses
    assert not vss.is_probable_prime(561) and not vss.is_probable_prime(Q * (2 ** 127 - 1))
    assert not vss.is_probable_prime(P + 2 * Q)  # (k + 2)·q + 1, a composite of the same form
    out = subprocess.run(["openssl", "prime", "-hex", f"{P + 2 * Q:x}"], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip().endswith("is not prime"), out


def test_shares_are_shamirs_own_and_each_verifies():
    rb_a, rb_b = seeded(5), seeded(5)
    secret = rb_a(32)
    assert secret == rb_b(32)
    xs = [3, 1, 9, 4, 12]
    shares, comm = vss.split_verifiable(secret, 3, xs, rb_a)
    assert shares == shamir.split(secret, 3, xs, rb_b)  # same randomness, same shares: one polynomial code
    assert all(len(s) == shamir.SHARE_BYTES for s in shares) and comm.threshold == 3
    assert all(vss.verify_share(x, s, comm) for x, s in zip(xs, shares))


def test_a_tampered_share_a_wrong_point_or_a_tampered_commitment_fails():
    _, xs, shares, comm = dealt()
    x, s = xs[2], shares[2]
    y = int.from_bytes(s, "big")
    for bad in (((y + 1) % Q).to_bytes(66, "big"), bytes([s[0] ^ 1]) + s[1:], s[:-1] + bytes([s[-1] ^ 0x80]),
                shares[3], Q.to_bytes(66, "big"), s[:-1], s + b"\0"):
        assert not vss.verify_share(x, bad, comm)
    for wrong_x in (xs[3], x + 100, 0, -x, Q, Q + x):
        assert not vss.verify_share(wrong_x, s, comm)
    for j in range(comm.threshold):  # every coefficient's commitment is bound into every share's check
        vals = list(comm.values)
        vals[j] = vals[j] * G % P  # still in the subgroup: a commitment to a_j + 1
        assert not vss.verify_share(x, s, Commitments(tuple(vals)))
    _, _, _, other = dealt(seed=2)
    assert not vss.verify_share(x, s, other)


def test_order_2_components_in_commitments_are_parsed_but_cannot_make_a_wrong_share_pass():
    """No subgroup test on what arrives: an order-k part in the commitments never lets a share off the committed
    polynomial pass, and one in C_0 makes verify_secret fail (the dealer is blamed either way)."""
    secret, xs, shares, comm = dealt()
    minus = P - 1  # the element of order 2
    assert pow(minus, Q, P) != 1 and pow(minus, 2, P) == 1
    # from_bytes takes values outside the order-q subgroup now (a range check only)
    for v in (minus, 2, comm.values[1] * minus % P):
        assert pow(v, Q, P) != 1
        vals = (comm.values[0], v) + comm.values[2:]
        assert Commitments.from_bytes(Commitments(vals).to_bytes(), comm.threshold).values == vals
    # an order-2 part on C_1: h^(x) = (-1)^x, so shares at odd points fail, those at even points still pass, and
    # those that pass are exactly the committed polynomial's values: off-polynomial shares never pass
    bent = Commitments.from_bytes(Commitments((comm.values[0], comm.values[1] * minus % P) + comm.values[2:])
                                  .to_bytes(), comm.threshold)
    for x, s in zip(xs, shares):
        assert vss.verify_share(x, s, bent) == (x % 2 == 0)
        y = int.from_bytes(s, "big")
        for off in (1, Q - 1, 2):
            assert not vss.verify_share(x, ((y + off) % Q).to_bytes(66, "big"), bent)
    # an order-2 part on C_0 (h^(x^0) = -1 at every x): every share fails, and the true secret fails verify_secret
    # (g^s lies in the subgroup, C_0 does not): the dealer is blamed, never a holder
    bent0 = Commitments((comm.values[0] * minus % P,) + comm.values[1:])
    assert not any(vss.verify_share(x, s, bent0) for x, s in zip(xs, shares))
    assert vss.verify_secret(secret, comm) and not vss.verify_secret(secret, bent0)
    assert shamir.combine(list(zip(xs, shares))[:comm.threshold]) == secret


def test_reconstruction_is_checked_against_the_commitment_to_the_secret():
    secret, xs, shares, comm = dealt(t=4, n=7)
    pts = list(zip(xs, shares))
    for subset in (pts[:4], pts[3:], pts[::2]):
        got = shamir.combine(subset)
        assert got == secret and vss.verify_secret(got, comm)
    assert not vss.verify_secret(shamir.combine(pts[:3]), comm)  # below the threshold: a wrong secret
    y = (int.from_bytes(shares[0], "big") + 1) % Q
    wrong = [(xs[0], y.to_bytes(66, "big"))] + pts[1:4]  # one wrong share: caught at reveal by verify_share too
    assert not vss.verify_share(*wrong[0], comm) and not vss.verify_secret(shamir.combine(wrong), comm)
    assert not vss.verify_secret(secret[:-1], comm) and not vss.verify_secret(secret + b"\0", comm)


def test_from_bytes_is_strict_and_round_trips():
    _, _, _, comm = dealt(t=3)
    data = comm.to_bytes()
    assert len(data) == 3 * ELEMENT_BYTES and Commitments.from_bytes(data, 3) == comm
    bad_lengths = [(data[:-1], 3), (data + b"\0", 3), (data, 2), (data, 4), (b"", 0), (b"", 1)]
    for blob, t in bad_lengths:
        with pytest.raises(ValueError, match="commitments are") as e:
            Commitments.from_bytes(blob, t)
        assert "\n" not in str(e.value)
    for v in (0, 1, P, P + 1, 2 ** (8 * ELEMENT_BYTES) - 1):
        blob = data[:ELEMENT_BYTES] + v.to_bytes(ELEMENT_BYTES, "big") + data[2 * ELEMENT_BYTES:]
        with pytest.raises(ValueError, match=r"commitment 1 is outside \[2, p-1\]"):
            Commitments.from_bytes(blob, 3)
    for vals in ((), (1,), (P,), (G, 2.0)):
        with pytest.raises(ValueError, match="non-empty tuple"):
            Commitments(vals)


def test_split_verifiable_refuses_what_split_refuses_and_a_zero_secret():
    with pytest.raises(ValueError, match="must not be all zero"):
        vss.split_verifiable(bytes(32), 2, [1, 2])
    with pytest.raises(ValueError, match="threshold 3"):
        vss.split_verifiable(b"\1" * 32, 3, [1, 2])
    with pytest.raises(ValueError, match="32 bytes"):
        vss.split_verifiable(b"\1" * 31, 1, [1])
    with pytest.raises(ValueError, match="distinct"):
        vss.split_verifiable(b"\1" * 32, 1, [1, 1])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(secret=st.binary(min_size=32, max_size=32), t=st.integers(1, 6),
       xs=st.lists(st.integers(1, 200), min_size=6, max_size=10, unique=True),
       delta=st.integers(1, Q - 1), seed=st.integers(0, 2 ** 32))
def test_property_every_share_verifies_any_change_fails_and_threshold_shares_rebuild_a_verified_secret(
        secret, t, xs, delta, seed):
    assume(any(secret))
    shares, comm = vss.split_verifiable(secret, t, xs, seeded(seed))
    comm = Commitments.from_bytes(comm.to_bytes(), t)
    assert all(vss.verify_share(x, s, comm) for x, s in zip(xs, shares))
    i = seed % len(xs)
    bad = ((int.from_bytes(shares[i], "big") + delta) % Q).to_bytes(66, "big")
    assert not vss.verify_share(xs[i], bad, comm)
    got = shamir.combine(list(zip(xs, shares))[-t:])
    assert got == secret and vss.verify_secret(got, comm)
