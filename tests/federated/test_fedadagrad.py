"""FedAdagrad against a hand-written Algorithm 2 of Reddi et al. (2021), and FedAdam's bias-corrected option against
Kingma & Ba's rule and against Flower's formula (its round r is Nebula's step r + 1)."""
from __future__ import annotations

import numpy as np
import pytest

from nebula.federated import get_strategy, strategy_names


def reference_fedadagrad(x0, means, eta, beta_1, tau):
    """Reddi et al. 2021, Alg. 2 (FedAdagrad line), written out: Δ_t = mean_t − x_t, m_t = β1 m_{t−1} + (1 − β1)Δ_t,
    v_t = v_{t−1} + Δ_t², x_{t+1} = x_t + η m_t / (√v_t + τ), m_{−1} = 0, v_{−1} = τ²."""
    x, m, v, out = x0.copy(), np.zeros_like(x0), np.full_like(x0, tau * tau), []
    for mean in means:
        d = mean - x
        m = beta_1 * m + (1 - beta_1) * d
        v = v + d * d
        x = x + eta * m / (np.sqrt(v) + tau)
        out.append((x.copy(), m.copy(), v.copy()))
    return out


@pytest.mark.parametrize("beta_1", [0.9, 0.0])
def test_fedadagrad_follows_algorithm_2(beta_1):
    eta, tau = 0.1, 1e-3
    s = get_strategy("fedadagrad", {"eta": eta, "beta_1": beta_1, "tau": tau})
    rng = np.random.default_rng(0)
    x = {"w": rng.normal(size=(5, 3)), "b": rng.normal(size=3)}
    means = [{k: v + rng.normal(size=v.shape) * 0.2 for k, v in x.items()} for _ in range(5)]
    refs = {k: reference_fedadagrad(x[k], [m[k] for m in means], eta, beta_1, tau) for k in x}
    cur, state = x, {}
    for t, mean in enumerate(means):
        cur, state = s.server_step(cur, mean, state)
        for k in x:
            want_x, want_m, want_v = refs[k][t]
            np.testing.assert_allclose(cur[k], want_x, rtol=1e-12)
            np.testing.assert_allclose(state[f"m/{k}"], want_m, rtol=1e-12)
            np.testing.assert_allclose(state[f"v/{k}"], want_v, rtol=1e-12)
    half, _ = s.server_step({"h": np.ones(3, np.float32)}, {"h": np.zeros(3, np.float32)}, {})
    assert half["h"].dtype == np.float32


def test_fedadagrad_never_forgets_where_fedadam_does():
    g = {"w": np.zeros(4)}
    big, small = {"w": np.full(4, 1.0)}, {"w": np.full(4, 1e-3)}
    ada, adam = get_strategy("fedadagrad"), get_strategy("fedadam", {"beta_2": 0.5})
    sa, sm = {}, {}
    _, sa = ada.server_step(g, big, sa)
    _, sm = adam.server_step(g, big, sm)
    v_ada, v_adam = sa["v/w"].copy(), sm["v/w"].copy()
    for _ in range(10):
        _, sa = ada.server_step(g, small, sa)
        _, sm = adam.server_step(g, small, sm)
    assert (sa["v/w"] >= v_ada).all() and (sm["v/w"] < 0.01 * v_adam).all()
    assert "fedadagrad" in strategy_names() and "beta_2" not in ada.describe()
    with pytest.raises(ValueError, match="fedadagrad eta=0 must be > 0"):
        get_strategy("fedadagrad", {"eta": 0})
    with pytest.raises(ValueError, match="bad options"):
        get_strategy("fedadagrad", {"beta_2": 0.9})


def test_bias_corrected_fedadam_is_kingma_and_ba_and_flowers_rule_one_round_later():
    eta, b1, b2, tau = 0.05, 0.9, 0.99, 1e-9
    s = get_strategy("fedadam", {"eta": eta, "beta_1": b1, "beta_2": b2, "tau": tau, "bias_correction": True})
    rng = np.random.default_rng(3)
    x = {"w": rng.normal(size=6)}
    m, v, state = np.zeros(6), np.zeros(6), {}

    def flower_eta(server_round):  # Flower's eta_norm, its rounds counting from 1
        return eta * np.sqrt(1 - b2 ** (server_round + 1.0)) / (1 - b1 ** (server_round + 1.0))

    for t in range(1, 5):
        mean = {"w": x["w"] + rng.normal(size=6) * 0.1}
        d = mean["w"] - x["w"]
        m = b1 * m + (1 - b1) * d
        v = b2 * v + (1 - b2) * d * d
        kingma = x["w"] + eta * np.sqrt(1 - b2 ** t) / (1 - b1 ** t) * m / (np.sqrt(v) + tau)
        flower = x["w"] + flower_eta(t - 1) * m / (np.sqrt(v) + tau)
        x, state = s.server_step(x, mean, state)
        np.testing.assert_allclose(x["w"], kingma, rtol=1e-12)
        np.testing.assert_allclose(x["w"], flower, rtol=1e-12)
        assert int(state["step"]) == t
    # the first corrected step is η·Δ/(|Δ| + τ/√(1 − β2)): about η·sign(Δ), whatever the scale of Δ
    g, mean = {"w": np.zeros(3)}, {"w": np.array([1e-2, -3e-2, 5e-2])}
    first, _ = get_strategy("fedadam", {"eta": 0.1, "bias_correction": True}).server_step(g, mean, {})
    np.testing.assert_allclose(first["w"], 0.1 * mean["w"] / (np.abs(mean["w"]) + 1e-3 / np.sqrt(1 - 0.99)))
    with pytest.raises(ValueError, match="bias_correction='yes' must be true or false"):
        get_strategy("fedadam", {"bias_correction": "yes"})
