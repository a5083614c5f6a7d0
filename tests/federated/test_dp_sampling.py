"""Differential privacy's ε is that of the mechanism the controller runs: the accountant the controller builds
gives dp-accounting's own ε for the sampler it draws with (Poisson: add/remove; fixed size: sampling without
replacement, replace-one, sensitivity 2C; local: replace-one), the samplers draw what their analysis assumes, a
Poisson round that draws nobody is still counted, the released mean has a fixed denominator, and the combinations
that would make ε untrue are refused at load."""
from __future__ import annotations

import random

import dp_accounting
import numpy as np
import pytest

from nebula.config.schema import ConfigError
from nebula.federated.config import ValiditySpec, load_federated_job
from nebula.federated.controller.privacy import RoundPrivacy, fixed_sample, poisson_sample
from nebula.federated.intake import GlobalModel, clip_pieces
from nebula.federated.privacy import DPConfig, clip_factor
from nebula.federated.controller.reduction import Reduction
from nebula.federated.controller.trail import ModelTrail, RoundRecord
from nebula.messaging import Peer
from testbed.fedjob import write_job
from testbed.fedruns import DELTA, dp_reference

def _privacy(tmp_path, num_clients: dict[str, int], per_round: int, rng=None, **dp) -> RoundPrivacy:
    job = load_federated_job(write_job(tmp_path, {c: tmp_path / f"{c}.yaml" for c in num_clients}, num_clients,
                                       clients_per_round=per_round,
                                       differential_privacy={"clip_norm": 0.5, "delta": DELTA, **dp}))
    return RoundPrivacy(job, ModelTrail(tmp_path / "trail"), rng)  # (open: the draws are recorded in it)


@pytest.mark.parametrize("clients,per_round,z,rounds,kind", [
    ({"A": 30, "B": 20}, 5, 1.1, 12, "rdp"),
    ({"A": 200}, 40, 0.8, 30, "rdp"),
    ({"A": 6, "B": 4}, 10, 2.0, 5, "rdp"),
    ({"A": 30, "B": 20}, 5, 1.1, 3, "pld"),
])
def test_poisson_epsilon_is_dp_accountings_for_the_poisson_sampled_gaussian(tmp_path, clients, per_round, z, rounds,
                                                                            kind):
    priv = _privacy(tmp_path, clients, per_round, noise_multiplier=z, sampler="poisson", accountant=kind)
    priv.accountant.step(rounds - 1)  # (ε of each earlier round is another dp-accounting computation)
    eps = [priv.accountant.epsilon(), priv.spend()["epsilon"]]
    q = per_round / sum(clients.values())
    g = dp_accounting.GaussianDpEvent(z)
    ref = dp_reference(g if q == 1 else dp_accounting.PoissonSampledDpEvent(q, g), rounds, kind)
    assert 0 < eps[0] < eps[1] and eps[-1] == pytest.approx(ref, rel=1e-9)
    d = priv.describe()
    assert (d["sampler"], d["accounted_sampler"], d["adjacency"], d["sampling_rate"]) == \
        ("poisson", "poisson", "add/remove", q)


@pytest.mark.parametrize("clients,per_round,z,rounds", [
    ({"A": 30, "B": 20}, 5, 1.1, 12),
    ({"A": 200}, 40, 0.8, 30),
    ({"A": 894}, 200, 1.0234375, 20),  # the recipe's DP accuracy table, ε = 8 row (894 clients hold data)
    ({"A": 6, "B": 4}, 10, 2.0, 5),  # everyone: no sampling, replace-one
])
def test_fixed_size_epsilon_is_dp_accountings_sampling_without_replacement_with_sensitivity_doubled(
        tmp_path, clients, per_round, z, rounds):
    priv = _privacy(tmp_path, clients, per_round, noise_multiplier=z, sampler="fixed")
    priv.accountant.step(rounds - 1)
    priv.spend()
    n = sum(clients.values())
    g = dp_accounting.GaussianDpEvent(z / 2)  # replacing a client moves the sum by 2C
    event = g if per_round == n else dp_accounting.SampledWithoutReplacementDpEvent(n, per_round, g)
    assert priv.describe()["epsilon"] == pytest.approx(dp_reference(event, rounds, "rdp", replace_one=True), rel=1e-9)
    assert (priv.describe()["sampler"], priv.describe()["adjacency"]) == ("fixed", "replace-one")
    if per_round == 200:  # the same noise under Poisson sampling spends far less: the table's 7.94 is 44 here
        poisson = _privacy(tmp_path / "p", clients, per_round, noise_multiplier=z, sampler="poisson")
        assert poisson.accountant.epsilon_after(rounds) == pytest.approx(7.9435, abs=1e-4)
        assert priv.describe()["epsilon"] > 5 * 8


@pytest.mark.parametrize("mode", ["local", "distributed"])
def test_local_and_distributed_dp_are_accounted_unsampled_with_sensitivity_2c(tmp_path, mode):
    sa = {"secure_aggregation": {"protocol": "secagg+", "max_weight": 1, "signers": "signers/client-{index}"}} \
        if mode == "distributed" else {}
    job = load_federated_job(write_job(tmp_path, {"A": tmp_path / "A.yaml"}, {"A": 10}, clients_per_round=3,
                                       strategy={"name": "fedavg"}, **sa,
                                       differential_privacy={"clip_norm": 0.5, "noise_multiplier": 3.0,
                                                             "mode": mode}))
    with ModelTrail(tmp_path / "trail") as trail:
        priv = RoundPrivacy(job, trail)
    priv.accountant.step(6)
    priv.spend()
    assert priv.describe()["epsilon"] == pytest.approx(dp_reference(dp_accounting.GaussianDpEvent(1.5), 7, "rdp"),
                                                       rel=1e-9)
    assert (priv.describe()["sampling_rate"], priv.describe()["adjacency"]) == (1.0, "replace-one")


def test_the_samplers_draw_what_their_analysis_assumes_from_the_whole_population():
    pop = [Peer("A", 2 + i) for i in range(50)]
    sysrand = random.SystemRandom()
    counts = [len(poisson_sample(pop, 0.2, sysrand.random)) for _ in range(2000)]
    # Binomial(50, 0.2): mean 10, the mean of 2000 draws within 8 of its standard deviations (0.063)
    assert abs(np.mean(counts) - 10) < 0.5 and min(counts) < 10 < max(counts)
    hits = np.zeros(len(pop))
    for _ in range(2000):
        drawn = fixed_sample(pop, 10, sysrand)
        assert len(drawn) == len(set(drawn)) == 10 and set(drawn) <= set(pop)
        hits[[pop.index(p) for p in drawn]] += 1
    assert abs(hits.mean() / 2000 - 0.2) < 1e-12 and hits.min() > 0  # every client can be drawn, 10 of 50 a draw


def test_a_round_draws_from_the_population_and_takes_part_only_if_connected(tmp_path):
    priv = _privacy(tmp_path, {"A": 3, "B": 3}, 6, noise_multiplier=1.0, sampler="fixed")
    connected = [Peer("A", 2), Peer("B", 3)]
    assert priv.sample(connected, 1) == sorted(connected) and priv.sampled == 6


class _Never(random.Random):
    """A draw that never falls under q: the Poisson sample is empty."""

    def random(self) -> float:
        return 0.999999


def test_a_poisson_round_that_draws_nobody_is_skipped_but_counted_and_counted_again_on_restart(tmp_path):
    priv = _privacy(tmp_path, {"A": 4}, 2, rng=_Never(), noise_multiplier=1.5, sampler="poisson")
    assert priv.sample([Peer("A", 2 + i) for i in range(4)], 1) == [] and priv.sampled == 0
    spent = priv.spend()  # the controller counts every round it runs
    assert spent["rounds"] == 1 and spent["epsilon"] == priv.accountant.epsilon_after(1) > 0
    assert spent["sampled"] == 0 and spent["sampler"] == "poisson"
    with ModelTrail(tmp_path / "trail") as trail:  # a restarted controller counts the recorded rounds that ran
        for r, status in enumerate(("invalid", "valid", "stopped"), 1):
            trail.record_round(RoundRecord(round=r, status=status, version=None, num_updates=0, num_examples=0,
                                           rejected=[], started=0.0, duration_s=0.0, detail={}))
    again = _privacy(tmp_path, {"A": 4}, 2, noise_multiplier=1.5, sampler="poisson")
    assert again.accountant.rounds == 2


def test_a_draw_is_counted_even_when_the_controller_dies_before_the_rounds_record(tmp_path):
    """The draw is in the trail before the round's clients hear of it: a controller killed between the draw and the
    round's record still counts it on restart, and the round run again counts a second draw (both reached an
    aggregator); a round recorded but never drawn (an older trail) counts once."""
    clients = [Peer("A", 2 + i) for i in range(10)]
    priv = _privacy(tmp_path, {"A": 10}, 4, noise_multiplier=1.2, sampler="fixed")
    priv.sample(clients, 1)
    priv.spend()
    priv.trail.record_round(RoundRecord(round=1, status="valid", version=None, num_updates=4, num_examples=4,
                                        rejected=[], started=0.0, duration_s=0.0, detail={}))
    priv.sample(clients, 2)  # ... and the controller dies here: no spend, no record of round 2
    priv.trail.close()
    again = _privacy(tmp_path, {"A": 10}, 4, noise_multiplier=1.2, sampler="fixed")
    assert again.accountant.rounds == 2 and again.trail.draws() == [1, 2]
    again.sample(clients, 2)  # round 2 run again
    assert again.spend()["rounds"] == 3 == len(again.trail.draws())
    again.trail.record_round(RoundRecord(round=3, status="invalid", version=None, num_updates=0, num_examples=0,
                                         rejected=[], started=0.0, duration_s=0.0, detail={}))
    assert _privacy(tmp_path, {"A": 10}, 4, noise_multiplier=1.2, sampler="fixed").accountant.rounds == 4


def test_the_central_release_divides_the_noisy_sum_by_the_expected_count(tmp_path):
    priv = _privacy(tmp_path, {"A": 10}, 4, noise_multiplier=1e-9, sampler="poisson")
    base = {"w": np.array([1.0, 2.0, 3.0], np.float32)}
    changes = [np.array([0.3, 0.0, -0.1]), np.array([0.1, 0.2, 0.0]), np.array([0.0, 0.0, 0.3])]
    for coded in (False, True):
        red = Reduction(base, coded=coded, update_codec="x" if coded else "none",
                        validity=ValiditySpec(), expected_examples=0)
        for c in changes:  # unit weights, as the combiners fold under DP
            red.mean.begin(1)
            red.mean.add_part("w", (c if coded else base["w"] + c).astype(np.float32))
        out = priv.release(red)
        # 3 took part, 4 expected: the sum over 4, never over 3 (which would tell how many were drawn)
        np.testing.assert_allclose(out["w"], base["w"] + sum(changes) / 4, atol=1e-6)
        assert out["w"].dtype == np.float32


def test_the_combiners_clip_scales_the_decoded_change_and_refuses_what_is_not_finite(tmp_path):
    base = {"w": np.array([1.0, -1.0, 0.5, 0.0], np.float32)}
    change = np.array([30.0, -40.0, 0.0, 0.0], np.float32)  # norm 50
    f = clip_factor(50.0, 0.5)
    raw = list(clip_pieces(iter([("w", 0, base["w"] + change)]), f, GlobalModel(base, tmp_path)))
    np.testing.assert_allclose(raw[0][2] - base["w"], change / 100, atol=1e-6)
    coded = list(clip_pieces(iter([("w", 0, change)]), f, None))
    assert np.linalg.norm(coded[0][2]) == pytest.approx(0.5, rel=1e-6) and coded[0][2].dtype == np.float32
    assert clip_factor(0.2, 0.5) == 1.0 and clip_factor(0.0, 0.5) == 1.0
    for bad in (float("inf"), float("nan")):
        with pytest.raises(ValueError, match="not finite"):
            clip_factor(bad, 0.5)


DPS = {"clip_norm": 1.0, "noise_multiplier": 1.0}


@pytest.mark.parametrize("over,needle", [
    ({"update_codec": "ef(topk(0.1))"},
     "update_codec='ef(topk(0.1))' with differential_privacy: error feedback adds what earlier rounds' compression "
     "left out"),
    ({"update_codec": "ef(int8_block)", "differential_privacy": {**DPS, "mode": "local"}},
     "update_codec='ef(int8_block)' with differential_privacy"),
    ({"secure_aggregation": {"protocol": "secagg+", "max_weight": 1}},
     "differential_privacy.mode=central with secure_aggregation: central DP has the combiner clip every update"),
    ({"differential_privacy": {**DPS, "sampler": "uniform"}}, "differential_privacy.sampler='uniform' is not one of"),
    ({"differential_privacy": {**DPS, "sampler": "fixed", "accountant": "pld"}},
     "differential_privacy.sampler=fixed with accountant=pld"),
])
def test_what_would_make_epsilon_untrue_is_refused_at_load_in_one_line(tmp_path, over, needle):
    doc = {"differential_privacy": DPS, "strategy": {"name": "fedavg"}, **over}
    with pytest.raises(ConfigError) as e:
        load_federated_job(write_job(tmp_path, {"A": tmp_path / "A.yaml"}, {"A": 3}, **doc))
    assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_a_codec_without_error_feedback_loads_with_dp(tmp_path):
    job = load_federated_job(write_job(tmp_path, {"A": tmp_path / "A.yaml"}, {"A": 3}, update_codec="topk(0.1)",
                                       differential_privacy={**DPS, "sampler": "fixed"}))
    assert job.update_codec == "topk(0.1)" and job.differential_privacy.sampler == "fixed"
    assert DPConfig(**DPS).sampler == "poisson"
