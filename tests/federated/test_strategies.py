"""Strategies: registry, FedAdam/FedYogi against their update equations, FedAsync and FedBuff staleness."""
from __future__ import annotations

import numpy as np
import pytest

from nebula.federated import get_strategy, strategy_names
from nebula.federated.strategies.fedasync import staleness_weight


def test_registry_has_every_strategy_and_rejects_unknown_names_and_options():
    assert {"fedavg", "fedprox", "fedadam", "fedyogi", "trimmed_mean", "median", "krum", "multi_krum", "fedasync",
            "fedbuff"} <= set(strategy_names())
    with pytest.raises(ValueError, match="unknown strategy 'fedsgd'; known: "):
        get_strategy("fedsgd")
    with pytest.raises(ValueError, match="bad options"):
        get_strategy("fedadam", {"etaa": 1})
    with pytest.raises(ValueError, match="mu=-1"):
        get_strategy("fedprox", {"mu": -1})
    assert get_strategy("fedprox", {"mu": 0.1}).client_options() == {"proximal_mu": 0.1}


@pytest.mark.parametrize("name", ["fedadam", "fedyogi"])
def test_fedadam_and_fedyogi_follow_their_update_equations(name):
    eta, b1, b2, tau = 0.05, 0.9, 0.99, 1e-3
    s = get_strategy(name, {"eta": eta, "beta_1": b1, "beta_2": b2, "tau": tau})
    rng = np.random.default_rng(0)
    x = {"w": rng.normal(size=(4, 3))}
    m, v = np.zeros((4, 3)), np.full((4, 3), tau ** 2)
    state = {}
    for _ in range(3):
        mean = {"w": x["w"] + rng.normal(size=(4, 3)) * 0.1}
        d = mean["w"] - x["w"]
        m = b1 * m + (1 - b1) * d
        v = b2 * v + (1 - b2) * d * d if name == "fedadam" else v - (1 - b2) * d * d * np.sign(v - d * d)
        ref = x["w"] + eta * m / (np.sqrt(v) + tau)
        x, state = s.server_step(x, mean, state)
        np.testing.assert_allclose(x["w"], ref, rtol=1e-12)
        np.testing.assert_allclose(state["m/w"], m)
        np.testing.assert_allclose(state["v/w"], v)


def test_staleness_functions_of_fedasync():
    assert staleness_weight(7, "constant") == 1.0
    assert staleness_weight(3, "polynomial", a=0.5) == pytest.approx(0.5)
    assert staleness_weight(4, "hinge", a=2, b=4) == 1.0
    assert staleness_weight(6, "hinge", a=2, b=4) == pytest.approx(1 / 5)
    with pytest.raises(ValueError, match="newer than the server"):
        staleness_weight(-1)


def test_fedasync_mixes_less_of_staler_updates():
    s = get_strategy("fedasync", {"alpha": 0.5, "staleness": "polynomial", "a": 1.0})
    g, u = {"w": np.zeros(3)}, {"w": np.ones(3)}
    fresh, _ = s.on_update(g, g, u, 10, 0, {})
    stale, _ = s.on_update(g, g, u, 10, 3, {})
    np.testing.assert_allclose(fresh["w"], 0.5)
    np.testing.assert_allclose(stale["w"], 0.5 * 0.25)


def test_fedbuff_steps_once_per_k_updates_with_staleness_weighted_deltas():
    s = get_strategy("fedbuff", {"buffer_size": 3, "server_lr": 2.0, "staleness": "polynomial", "a": 1.0})
    g = {"w": np.zeros(2)}
    state = {}
    deltas = []
    for i, (val, tau) in enumerate([(1.0, 0), (2.0, 1), (4.0, 3)]):
        base = {"w": np.full(2, 0.5)}
        new, state = s.on_update(g, base, {"w": np.full(2, 0.5 + val)}, 5, tau, state)
        deltas.append(val / (tau + 1))
        if i < 2:
            assert new is None
    np.testing.assert_allclose(new["w"], 2.0 * np.mean(deltas))
    assert not any(k.startswith("buffer") for k in state)


def test_robust_strategies_resist_a_scaled_attacker_where_fedavg_does_not():
    rng = np.random.default_rng(1)
    honest = [({"w": 1.0 + rng.normal(size=5) * 0.01}, 10) for _ in range(8)]
    attack = [({"w": -100.0 * np.ones(5)}, 10) for _ in range(2)]
    ups = honest + attack
    assert np.abs(get_strategy("fedavg").combine(ups)["w"] - 1).max() > 10
    for name, opts in (("trimmed_mean", {"trim_ratio": 0.2}), ("median", {}), ("krum", {"num_byzantine": 2}),
                       ("multi_krum", {"num_byzantine": 2})):
        got = get_strategy(name, opts).combine(ups)["w"]
        assert np.abs(got - 1).max() < 0.05, name
