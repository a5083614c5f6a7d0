"""Aggregation functions against plain numpy references, streaming and hierarchical equality, bad input."""
from __future__ import annotations

import numpy as np
import pytest

from nebula.federated import RunningMean, fedavg, krum, median, multi_krum, trimmed_mean


def _updates(rng, n, shapes=None, dtype=np.float32):
    shapes = shapes or {"w": (3, 4), "b": (4,)}
    return [({k: rng.normal(size=s).astype(dtype) for k, s in shapes.items()}, int(rng.integers(1, 50)))
            for _ in range(n)]


def test_fedavg_is_the_example_weighted_mean():
    rng = np.random.default_rng(0)
    ups = _updates(rng, 7, dtype=np.float64)
    got = fedavg(ups)
    n = np.array([c for _, c in ups], float)
    for k in ("w", "b"):
        ref = (np.stack([w[k] for w, _ in ups]) * (n / n.sum()).reshape(-1, *[1] * ups[0][0][k].ndim)).sum(0)
        np.testing.assert_allclose(got[k], ref, rtol=1e-12)
        assert got[k].dtype == np.float64


def test_trimmed_mean_and_median_match_sorted_references():
    rng = np.random.default_rng(1)
    ups = _updates(rng, 10)
    st = np.sort(np.stack([w["w"] for w, _ in ups]), axis=0)
    np.testing.assert_allclose(trimmed_mean(ups, 0.2)["w"], st[2:8].mean(0), rtol=1e-6)
    np.testing.assert_allclose(trimmed_mean(ups, 0.0)["w"], st.mean(0), rtol=1e-6)
    np.testing.assert_allclose(median(ups)["w"], np.median(st, axis=0), rtol=1e-6)


def _krum_reference(vecs, f):
    n = len(vecs)
    scores = []
    for i in range(n):
        d = sorted(float(((vecs[i] - vecs[j]) ** 2).sum()) for j in range(n) if j != i)
        scores.append(sum(d[: n - f - 2]))
    return np.argsort(scores, kind="stable")


def test_krum_and_multi_krum_pick_the_reference_choice_and_drop_outliers():
    rng = np.random.default_rng(2)
    ups = _updates(rng, 9, dtype=np.float64)
    ups[3] = ({k: v * 100 for k, v in ups[3][0].items()}, ups[3][1])
    ups[5] = ({k: -v * 50 for k, v in ups[5][0].items()}, ups[5][1])
    vecs = [np.concatenate([w["b"], w["w"].ravel()]) for w, _ in ups]
    order = _krum_reference(vecs, 2)
    np.testing.assert_allclose(krum(ups, 2)["w"], ups[order[0]][0]["w"])
    got = multi_krum(ups, 2, 5)["w"]
    np.testing.assert_allclose(got, np.mean([ups[i][0]["w"] for i in order[:5]], axis=0))
    assert 3 not in order[:5] and 5 not in order[:5]


def test_running_mean_streams_pieces_and_equals_fedavg():
    rng = np.random.default_rng(3)
    ups = _updates(rng, 20, {"w": (50, 30)}, np.float64)
    rm = RunningMean(ups[0][0])
    for w, n in ups:
        rm.begin(n)
        flat = w["w"].ravel()
        for off in range(0, flat.size, 333):  # an update arriving in pieces
            rm.add_part("w", flat[off:off + 333], off)
    np.testing.assert_allclose(rm.result()["w"], fedavg(ups)["w"], rtol=1e-10, atol=1e-12)


def test_hierarchical_combiners_then_reducer_equal_flat_fedavg():
    rng = np.random.default_rng(4)
    ups = _updates(rng, 30, {"w": (20, 10), "b": (10,)})
    flat = fedavg(ups)
    reducer = RunningMean()
    for part in (ups[:7], ups[7:19], ups[19:]):  # three combiners of unequal size
        comb = RunningMean()
        for w, n in part:
            comb.add(w, n)
        reducer.add(comb.result(), comb.num_examples)
    for k in flat:
        np.testing.assert_allclose(reducer.result()[k], flat[k], atol=1e-6)
    assert reducer.num_examples == sum(n for _, n in ups)


@pytest.mark.parametrize("mutate,needle", [
    (lambda w: w.pop("b"), "missing ['b']"),
    (lambda w: w.__setitem__("x", np.zeros(1, np.float32)), "unexpected ['x']"),
    (lambda w: w.__setitem__("b", np.zeros(5, np.float32)), "has shape (5,), expected (4,)"),
    (lambda w: w.__setitem__("b", np.zeros(4, np.float64)), "has dtype float64, expected float32"),
    (lambda w: w.__setitem__("b", np.zeros(4, np.int32)), "not a floating type"),
    (lambda w: w["b"].__setitem__(0, np.nan), "NaN or Inf"),
    (lambda w: w["w"].__setitem__((0, 0), np.inf), "NaN or Inf"),
])
@pytest.mark.parametrize("fn", [fedavg, median, lambda u, clients: trimmed_mean(u, 0.1, clients),
                                lambda u, clients: krum(u, 0, clients)])
def test_bad_updates_raise_naming_the_client_and_problem(fn, mutate, needle):
    rng = np.random.default_rng(5)
    ups = _updates(rng, 4)
    mutate(ups[2][0])
    with pytest.raises(ValueError) as e:
        fn(ups, clients=["a", "b", "mallory", "d"])
    assert "client 'mallory'" in str(e.value) and needle in str(e.value)


def test_empty_and_bad_counts_raise():
    with pytest.raises(ValueError, match="no updates"):
        fedavg([])
    rng = np.random.default_rng(6)
    ups = _updates(rng, 2)
    ups[1] = (ups[1][0], 0)
    with pytest.raises(ValueError, match="update 1: num_examples=0"):
        fedavg(ups)
    with pytest.raises(ValueError, match="needs more than 4 updates"):
        krum(_updates(rng, 4), 1)
    rm = RunningMean(_updates(rng, 1)[0][0])
    with pytest.raises(ValueError, match="has shape"):
        rm.add({"w": np.zeros((4, 3), np.float32), "b": np.zeros(4, np.float32)}, 3, "client 'z'")
