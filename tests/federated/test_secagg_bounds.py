"""Bounded client inputs for SecAgg+: public weights (no count word), the unmasked sum range-checked against what
the survivors' clipped inputs can sum to, the one-client influence left under the check, and the benchmark that
measures it."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from nebula.federated.secagg.quantize import Quantizer
from tests.harness.readme import run_printed

REPO = Path(__file__).resolve().parents[2]


def summed(q: Quantizer, words: list[np.ndarray]) -> np.ndarray:
    acc = np.zeros(words[0].size, q.dtype)
    for w in words:
        acc += w  # mod 2^b, as a combiner adds masked inputs (the masks cancel in the sum)
    return acc


def signed(q: Quantizer, words: np.ndarray) -> np.ndarray:
    return words.view(np.int32 if q.word_bits == 32 else np.int16).astype(np.int64)


def test_encode_vector_gives_one_word_per_value_and_decodes_to_the_weighted_sum():
    q = Quantizer(2.0, 20, 1000)
    rng = np.random.default_rng(1)
    xs = [rng.normal(0, 1.5, 500) for _ in range(20)]  # some values beyond the clip range
    weights = [int(w) for w in rng.integers(1, 1001, 20)]
    words = [q.encode_vector(x, w) for x, w in zip(xs, weights)]
    for x, w, v in zip(xs, weights, words):
        assert v.dtype == q.dtype and v.shape == (500,)
    total = summed(q, words)
    q.check_sum_range(total, weights)
    ref = sum((w / 1000) * np.clip(x, -2.0, 2.0) for x, w in zip(xs, weights))
    got = q.decode_sum(total, sum(weights))
    assert got.dtype == np.float64 and np.abs(got - ref).max() <= q.error_bound(20)
    assert not hasattr(q, "encode")  # the count-word format is gone: a weight is public, never a masked word


@pytest.mark.parametrize("bits,clip,n,w_cap", [(32, 1.0, 100, 1000), (32, 0.1, 1000, 4_000_000), (16, 1.0, 8, 50),
                                                (16, 0.25, 3, 1)])
def test_honest_extremes_at_max_clients_and_max_weight_neither_overflow_nor_trip_the_check(bits, clip, n, w_cap):
    q = Quantizer(clip, n, w_cap, bits)
    assert q.sum_bound([w_cap] * n) <= 2 ** (bits - 1) - 1  # the honest range fits the signed word
    for sign in (1.0, -1.0):
        x = np.full(7, 3 * sign * clip)  # clipped to +-clip: every client at the edge of the range
        total = summed(q, [q.encode_vector(x, w_cap)] * n)
        q.check_sum_range(total, [w_cap] * n)
        assert np.all(signed(q, total) == sign * q.sum_bound([w_cap] * n))  # the edge exactly, no wrap
        assert np.allclose(q.decode_sum(total, n * w_cap), sign * n * clip, atol=q.error_bound(n))


@settings(max_examples=60, deadline=None)
@given(clip=st.floats(1e-3, 1e3), n=st.integers(1, 5000), w_cap=st.integers(1, 10 ** 6), bits=st.sampled_from([16, 32]))
def test_property_word_size_leaves_no_overflow_for_max_clients_at_max_weight(clip, n, w_cap, bits):
    try:
        q = Quantizer(clip, n, w_cap, bits)
    except ValueError:
        assume(False)
    assert q.sum_bound([w_cap] * n) <= 2 ** (bits - 1) - 1
    # the encoder never exceeds its own bound, at the clip range and beyond it
    for w in {1, w_cap // 2 or 1, w_cap}:
        words = q.encode_vector(np.array([clip, -clip, 10 * clip, -10 * clip, clip * 0.999]), w)
        assert np.abs(signed(q, words)).max() == q.word_bound(w)


def test_a_sum_one_word_outside_the_range_is_refused_in_one_line():
    q = Quantizer(1.0, 10, 100)
    weights = [100, 50, 7]
    total = summed(q, [q.encode_vector(np.full(30, 5.0), w) for w in weights])  # at +bound everywhere
    q.check_sum_range(total, weights)
    bad = total.copy()
    bad[[3, 17]] += np.array(1, q.dtype)  # two coordinates one word past the bound
    with pytest.raises(ValueError, match=r"2 of 30 coordinates lie outside \+-1\.57") as e:
        q.check_sum_range(bad, weights)
    assert "\n" not in str(e.value) and "out-of-range words" in str(e.value)
    low = summed(q, [q.encode_vector(np.full(30, -5.0), w) for w in weights])
    low[0] -= np.array(1, q.dtype)
    with pytest.raises(ValueError, match="1 of 30 coordinates"):
        q.check_sum_range(low, weights)
    with pytest.raises(ValueError, match="30 of 30 coordinates"):  # the same sum, for a lighter client, is too big
        q.check_sum_range(total, weights[:2] + [6])


def test_out_of_range_words_from_one_client_are_detected_even_against_opposite_honest_inputs():
    q = Quantizer(1.0, 10, 1)
    honest = [q.encode_vector(np.full(50, -1.0), 1) for _ in range(9)]  # the honest sum sits at -9
    attack = q.encode_vector(np.zeros(50), 1) + np.array(2 * 10 * q.word_bound(1) + 1, q.dtype)  # > 2 x the range
    with pytest.raises(ValueError, match="50 of 50 coordinates"):
        q.check_sum_range(summed(q, honest + [attack]), [1] * 10)


def test_weights_are_public_integers_in_1_to_max_weight():
    q = Quantizer(1.0, 3, 10)
    words = np.zeros(4, q.dtype)
    for w in (0, 11, -1, True, 2.0, "3"):
        with pytest.raises(ValueError, match=r"integer in \[1, 10\]"):
            q.encode_vector(np.zeros(4), w)
        with pytest.raises(ValueError, match=r"integer in \[1, 10\]"):
            q.check_sum_range(words, [5, w])
    assert q.encode_vector(np.ones(2), np.int64(10)).dtype == q.dtype
    with pytest.raises(ValueError, match=r"1\.\.3 survivors' weights, got 4"):
        q.check_sum_range(words, [1, 1, 1, 1])
    with pytest.raises(ValueError, match="1-D array of uint32"):
        q.check_sum_range(words.astype(np.int64), [1])
    for total in (0, 31, True, 1.5):
        with pytest.raises(ValueError, match=r"total_weight=.* must be an integer in \[1, 30\]"):
            q.decode_sum(words, total)


@settings(max_examples=40, deadline=None)
@given(weights=st.lists(st.integers(1, 1000), min_size=2, max_size=30), clip=st.floats(0.01, 100),
       who=st.integers(0, 29), seed=st.integers(0, 2 ** 32))
def test_property_max_influence_is_exactly_what_one_client_can_do_unseen(weights, clip, who, seed):
    q = Quantizer(clip, 30, 1000)
    who %= len(weights)
    rng = np.random.default_rng(seed)
    others = [q.encode_vector(rng.uniform(-2 * clip, 2 * clip, 16), w) for i, w in enumerate(weights) if i != who]
    h = signed(q, summed(q, others))
    bound = q.sum_bound(weights)
    means = []
    for target in (bound, -bound):  # the attacker's words put the sum at each edge of the check: it passes
        total = summed(q, others + [np.remainder(target - h, 1 << 32).astype(q.dtype)])
        q.check_sum_range(total, weights)
        means.append(q.decode_sum(total, sum(weights)) * 1000 / sum(weights))
        with pytest.raises(ValueError):  # one word further is refused
            q.check_sum_range(total + np.array(1 if target > 0 else -1, np.int64).astype(q.dtype), weights)
    moved = np.abs(means[0] - means[1])
    assert np.allclose(moved, q.max_influence(weights), rtol=1e-12)
    assert abs(q.max_influence(weights) - 2 * clip) <= len(weights) / q.scale * 1000 / sum(weights)
    # an honest client of weight w moves it by 2·B(w) only: the attacker's reach is Σw/w times that, at most n times
    honest = 2 * q.word_bound(weights[who]) / q.scale * 1000 / sum(weights)
    assert q.max_influence(weights) <= honest * q.sum_bound(weights) / q.word_bound(weights[who]) * (1 + 1e-12)
    if len(set(weights)) == 1:
        assert q.max_influence(weights) == pytest.approx(len(weights) * honest, rel=1e-12)


def _rows(out: str) -> dict[str, tuple[str, ...]]:
    rows = {}
    for line in out.splitlines():
        m = re.match(r"(honest client \(reference\)|out-of-range words|weight above max_weight|in-range worst case)"
                     r"\s+(\S+)\s+(\S+)$", line)
        if m:
            rows[m[1]] = m.groups()[1:]
    assert len(rows) == 4, out
    return rows


def _x(v: str) -> float:
    return float(v.rstrip("x"))


def check_influence_table(out: str, n: int) -> float:
    """The benchmark's claims, from rounds of the real state machines: out-of-range words make the round refused,
    a weight above max_weight is refused, and the in-range worst case passes unseen but moves the mean at most
    n x an honest client."""
    assert "computed with: SecAggClient/SecAggServer rounds" in out
    rows = _rows(out)
    assert rows["out-of-range words"] == ("refused", "yes")
    assert re.search(r"out-of-range words: secagg round \d+: secure sum: \d+ of \d+ coordinates lie outside", out)
    assert rows["weight above max_weight"] == ("refused", "yes")
    assert re.search(r"weight above max_weight: .*'A/2'.*integer in \[1, 1000\]; got 2000", out)
    assert rows["honest client (reference)"][1] == "no" and _x(rows["honest client (reference)"][0]) == \
        pytest.approx(1.0, abs=0.01)
    worst = _x(rows["in-range worst case"][0])
    assert 1.0 < worst <= n and rows["in-range worst case"][1] == "no"
    bound = re.search(r"max_influence = \S+ on the mean \((\S+)x an honest client", out)
    assert bound and worst <= float(bound[1]) + 0.01
    return worst


def test_the_influence_benchmark_detects_out_of_range_words_and_bounds_the_rest_by_n():
    n = 5
    out = subprocess.run([sys.executable, "benchmarks/secagg_influence.py", "--clients", str(n), "--params", "300"],
                         cwd=REPO, capture_output=True, text=True, timeout=120, check=True,
                         env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}).stdout
    check_influence_table(out, n)


PRINTED = ["PYTHONPATH=. .venv/bin/python benchmarks/secagg_influence.py --clients 10 --params 10000"]


@pytest.mark.parametrize("command", PRINTED)
def test_the_printed_influence_command_runs_as_printed(command):
    """The command the benchmark's docstring and recipes/federated/README.md print (a few seconds), run as a user
    would."""
    check_influence_table(run_printed(command, timeout_s=120), 10)
