"""Differential privacy: clipping bounds each client's influence, the noise sits where the mode says with the stated
std, ε matches dp-accounting's for the same parameters and the exact Gaussian curve, and the budget stops a job."""
from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting import pld, rdp
from scipy import optimize, stats

from nebula.federated.privacy import (DPConfig, PrivacyAccountant, clip_update, client_noise_std, privatize_update,
                                      sampling_rate_for, server_noise_std, update_norm)


def test_clipping_bounds_the_whole_update_and_keeps_its_direction():
    rng = np.random.default_rng(0)
    u = {"a": rng.normal(size=(30, 4)).astype(np.float32), "b": rng.normal(size=50).astype(np.float32)}
    clipped, norm = clip_update(u, 1.5)
    assert norm == pytest.approx(update_norm(u)) and norm > 1.5
    assert update_norm(clipped) == pytest.approx(1.5, rel=1e-6)
    for k in u:  # one factor for all tensors: the direction is kept
        np.testing.assert_allclose(clipped[k], u[k] * (1.5 / norm), rtol=1e-6)
        assert clipped[k].dtype == np.float32
    small, _ = clip_update({"a": u["a"] * 1e-3}, 1.5)
    np.testing.assert_array_equal(small["a"], u["a"] * np.float32(1e-3))


def test_noise_sits_where_the_mode_puts_it_with_the_stated_std():
    z, c = 1.2, 0.5
    central = DPConfig(clip_norm=c, noise_multiplier=z)
    local = DPConfig(clip_norm=c, noise_multiplier=z, mode="local")
    dist = DPConfig(clip_norm=c, noise_multiplier=z, mode="distributed")
    assert (client_noise_std(central), server_noise_std(central)) == (0.0, z * c)
    assert (client_noise_std(local), server_noise_std(local)) == (z * c, 0.0)
    assert server_noise_std(dist) == 0.0 and client_noise_std(dist, 9) == pytest.approx(z * c / 3)
    # distributed: the sum of the threshold's t clients' noise has the central std zC
    t, d = 9, 40000
    rng = np.random.default_rng(1)
    total = sum(privatize_update({"w": np.zeros(d)}, dist, rng, min_clients=t)[0]["w"] for _ in range(t))
    lo, hi = stats.chi2.ppf([1e-6, 1 - 1e-6], d)  # the sample variance's 1e-6 band under N(0, (zC)²)
    assert lo / d < np.var(total) / (z * c) ** 2 < hi / d
    assert stats.kstest(total / (z * c), "norm").pvalue > 1e-4


def _exact_gaussian_epsilon(sigma: float, delta: float) -> float:
    """Balle & Wang (2018), Thm 8: the exact ε(δ) of one Gaussian mechanism, sensitivity 1, std sigma."""
    def gap(eps):
        return (stats.norm.cdf(1 / (2 * sigma) - eps * sigma)
                - math.exp(eps) * stats.norm.cdf(-1 / (2 * sigma) - eps * sigma) - delta)
    return optimize.brentq(gap, 0.0, 100.0)


def test_epsilon_matches_dp_accounting_for_the_same_parameters():
    z, q, delta = 1.1, 0.05, 1e-5
    for kind, make, rounds in (("rdp", rdp.RdpAccountant, 10), ("pld", pld.PLDAccountant, 3)):
        acc = PrivacyAccountant(z, q, delta, kind)
        eps = [acc.step() for _ in range(rounds)]  # round by round, as a job reports it
        assert eps == sorted(eps) and eps[0] > 0
        ref = make()
        ref.compose(dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), rounds))
        assert eps[-1] == pytest.approx(ref.get_epsilon(delta), rel=1e-9)


def test_unsampled_epsilon_against_the_exact_gaussian_curve():
    z, rounds, delta = 3.0, 16, 1e-5
    exact = _exact_gaussian_epsilon(z / math.sqrt(rounds), delta)  # T Gaussians compose to one with z/√T
    got_pld = PrivacyAccountant(z, 1.0, delta, "pld").epsilon_after(rounds)
    got_rdp = PrivacyAccountant(z, 1.0, delta, "rdp").epsilon_after(rounds)
    assert got_pld == pytest.approx(exact, rel=0.02)
    assert exact <= got_rdp < 1.3 * exact  # RDP is an upper bound, and not a loose one


def test_the_budget_stops_the_job_before_it_is_overspent():
    acc = PrivacyAccountant(2.0, 0.5, 1e-5)
    target = 3.0
    last = acc.max_rounds(target)
    assert acc.epsilon_after(last) <= target < acc.epsilon_after(last + 1)
    for _ in range(last):
        assert acc.budget(target).may_continue
        acc.step()
    status = acc.budget(target)
    assert not status.may_continue and status.epsilon <= target < status.next_epsilon
    assert "\n" not in status.reason and f"after {last} rounds" in status.reason and "target_epsilon 3 " in status.reason
    assert acc.budget(None).may_continue


def test_sampling_amplification_only_against_who_did_not_see_the_sample():
    assert sampling_rate_for("central", 10, 200) == 0.05
    assert sampling_rate_for("local", 10, 200) == sampling_rate_for("distributed", 10, 200) == 1.0
    with pytest.raises(ValueError, match="between 1 and the population 200"):
        sampling_rate_for("central", 300, 200)


@pytest.mark.parametrize("kwargs,needle", [
    ({"clip_norm": 0, "noise_multiplier": 1}, "differential_privacy.clip_norm=0"),
    ({"clip_norm": 1, "noise_multiplier": 0}, "differential_privacy.noise_multiplier=0"),
    ({"clip_norm": 1, "noise_multiplier": 1, "mode": "global"}, "differential_privacy.mode='global'"),
    ({"clip_norm": 1, "noise_multiplier": 1, "delta": 1}, "differential_privacy.delta=1"),
    ({"clip_norm": 1, "noise_multiplier": 1, "target_epsilon": -1}, "differential_privacy.target_epsilon=-1"),
    ({"clip_norm": 1, "noise_multiplier": 1, "accountant": "moments"}, "differential_privacy.accountant"),
])
def test_bad_settings_are_named_with_their_key_path(kwargs, needle):
    with pytest.raises(ValueError, match=needle.replace("(", r"\(")) as e:
        DPConfig(**kwargs)
    assert "\n" not in str(e.value)


def test_distributed_noise_survives_the_masked_path_with_at_least_the_central_std():
    from nebula.federated.secagg import SecAggConfig, flatten
    from tests.federated.test_secagg import run_round

    z, c, d = 1.0, 0.01, 20000
    cfg = DPConfig(clip_norm=c, noise_multiplier=z, mode="distributed")
    names = [f"c{i}" for i in range(6)]
    params = SecAggConfig(clip_range=0.05, max_weight=1).round_params(1, names, d, b"n" * 16)
    rng, noise_rng = np.random.default_rng(0), np.random.default_rng(1)
    raw = {n: {"w": rng.normal(0, 1, d)} for n in names}
    clipped = {n: clip_update(raw[n], c)[0] for n in names}
    sent = {n: flatten(privatize_update(raw[n], cfg, noise_rng, min_clients=params.threshold)[0], ["w"])
            for n in names}
    srv, _, _ = run_round(params, sent, {n: 1 for n in names}, after_shares=names[:1], seed=2)
    s = srv.result()
    noise = s.vector - sum(clipped[n]["w"] for n in s.survivors)  # what protects the sum
    want = z * c * math.sqrt(len(s.survivors) / params.threshold)  # >= zC: sized for the threshold's t clients
    assert len(s.survivors) > params.threshold and want > z * c
    lo, hi = stats.chi2.ppf([1e-6, 1 - 1e-6], d)
    assert lo / d < np.var(noise) / want ** 2 < hi / d
