"""Differential privacy end to end through TLS switch servers: clients clip (and, by mode, noise) their changes,
the reducer adds the central noise, the accountant's epsilon after every round is in the model trail, `nebula fl
status` and `nebula fl rounds`, the sampler run is named in every round's record, and a job stops once its
target_epsilon would be overspent."""
from __future__ import annotations

import json

import dp_accounting
import numpy as np
import pytest
from dp_accounting import rdp

from nebula.cli import main
from nebula.federated.controller.trail import ModelTrail
from testbed.fedjob import federation, run_job, write_job

# a fixed sample of 2 of the 4 clients a round, so that every round has its 2 updates
DP = {"clip_norm": 0.5, "noise_multiplier": 2.0, "mode": "central", "delta": 1e-5, "accountant": "rdp",
      "target_epsilon": 6.5, "sampler": "fixed"}


def _fixed_epsilon(rounds: int) -> float:
    """dp-accounting's ε of `rounds` rounds of 2 clients of 4 drawn without replacement, Gaussian noise z = 2 on a
    sum whose sensitivity is 2C (replace-one): noise multiplier 1."""
    acc = rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    acc.compose(dp_accounting.SampledWithoutReplacementDpEvent(4, 2, dp_accounting.GaussianDpEvent(1.0)), rounds)
    return acc.get_epsilon(1e-5)


def test_epsilon_in_trail_status_and_rounds_is_the_accountants_and_the_budget_stops_the_job(procs, tmp_path,
                                                                                              capsys):
    workers = federation(procs, tmp_path)
    # 2 of 4 clients a round: sampling rate 0.5; epsilon 5.97 after 2 rounds, 7.47 after 3 > target 6.5
    job = write_job(tmp_path, workers, {"A": 2, "B": 2}, rounds=5, clients_per_round=2, differential_privacy=DP,
                    strategy={"name": "fedadagrad", "options": {"eta": 0.1}})
    out = run_job(procs, job)
    eps = {i: _fixed_epsilon(i) for i in (1, 2, 3)}
    assert eps[2] <= DP["target_epsilon"] < eps[3]
    with ModelTrail(tmp_path / "fl" / "trail") as t:
        rounds, models = t.rounds(), t.models()
        w1, w3 = t.load(1)[0], t.load(3)[0]
    assert [r.status for r in rounds] == ["valid", "valid", "stopped"], out
    for i, r in enumerate(rounds[:2], 1):
        assert r.num_updates == 2 and r.detail["privacy"]["epsilon"] == pytest.approx(eps[i], rel=1e-9)
        assert (r.detail["privacy"]["sampler"], r.detail["privacy"]["sampled"]) == ("fixed", 2)
        assert models[i].metrics["epsilon"] == r.detail["privacy"]["epsilon"] and models[i].metrics["delta"] == 1e-5
        assert models[i].strategy["name"] == "fedadagrad"
        assert "parent_accuracy" not in models[i].metrics  # no client metric leaves a client under DP
    why = rounds[2].detail["why"]
    assert why.startswith(f"privacy budget spent: epsilon {eps[2]:.3f} after 2 rounds, round 3 would reach "
                          f"{eps[3]:.3f} > target_epsilon 6.5") and "\n" not in why
    assert all(np.isfinite(v).all() for v in w3.values()) and any((w3[k] != w1[k]).any() for k in w1)

    def cli(*argv):
        assert main(["fl", *argv, str(job)]) == 0
        return capsys.readouterr().out

    status = json.loads(cli("status", "--json"))
    assert status["state"] == "stopped" and status["reason"] == why and status["round"] == 2
    assert status["privacy"]["epsilon"] == pytest.approx(eps[2], rel=1e-9) and status["privacy"]["sampling_rate"] == 0.5
    assert status["privacy"]["sampler"] == "fixed"
    text = cli("status")
    assert f"reason: {why}" in text
    assert f"privacy: epsilon {eps[2]:.4f} at delta 1e-05 after 2 rounds (central DP" in text
    table = cli("rounds").splitlines()
    assert "epsilon" in table[0]
    assert [line.split()[7] for line in table[1:3]] == [f"{eps[i]:.4f}" for i in (1, 2)]
    assert table[3].split()[1] == "stopped" and "privacy budget spent" in table[3]
    audit = [json.loads(x) for x in (tmp_path / "fl" / "controller" / "audit.log").read_text().splitlines()]
    assert [r["outcome"] for r in audit if r["action"] == "fl.stop"] == ["budget"]
