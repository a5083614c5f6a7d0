"""Secure aggregation and differential privacy as capabilities of the actors: each actor's are chosen once from the
job file, and each "off" is a no-op with the same methods as its "on" (the rounds call them whatever the job says).
Pure: no sockets, no processes; the controller's capabilities over a real `Reduction`, the privacy one over a real
trail."""
from __future__ import annotations

import random

import numpy as np
import pytest

from nebula.federated.client.client import PlainTraining, task_answer
from nebula.federated.client.secure import SecureTraining
from nebula.federated.combiner.capabilities import CLIP_SLACK, CentralClip, FoldPolicy, fold_policy, round_kind
from nebula.federated.combiner.rounds import ROUNDS, SyncRound
from nebula.federated.combiner.secure import SecureRound
from nebula.federated.config import ValiditySpec, load_federated_job
from nebula.federated.controller.capabilities import (SEED_STRIDE, NoRoundPrivacy, PlainRounds, SecureRounds,
                                                      privacy_policy, secure_policy)
from nebula.federated.controller.privacy import RoundPrivacy
from nebula.federated.controller.reduction import Reduction
from nebula.federated.controller.trail import ModelTrail
from nebula.federated.messages import Partial
from nebula.federated.privacy import AsTrained, Privatize
from nebula.federated.secagg import UNMASK_STAGES, SecAggConfig
from nebula.messaging import Peer
from testbed.fedjob import write_job

SA = {"protocol": "secagg+", "signers": "signers/client-{index}", "max_weight": 1, "stage_timeout_s": 4.0}
DP = {"clip_norm": 0.5, "noise_multiplier": 1.0, "delta": 1e-5}
A, B = Peer("A", 0), Peer("B", 0)


def _job(tmp_path, **over):
    return load_federated_job(write_job(tmp_path, {"A": tmp_path / "A.yaml", "B": tmp_path / "B.yaml"},
                                        {"A": 4, "B": 4}, **over))


def _reduction(revealed=(), valid=True) -> Reduction:
    """A secure round's reduction: `revealed` combiners' sums folded (or none: `valid` False leaves it short)."""
    red = Reduction({"w": np.zeros(2, np.float32)}, coded=True, update_codec="none",
                    validity=ValiditySpec(min_updates=1 if valid else 99), expected_examples=0, max_weight=1)
    for c in revealed:
        p = Partial(run="r", round=1, version=1, num_updates=2, num_examples=2, clients=("x", "y"), delta=True,
                    weight=2, error_bound=1e-6, dropped=("z",), protocol_bytes=(10, 20))
        red.revealed.append(c)
        red.begin(p, str(c))
        red.mean.add_part("w", np.ones(2, np.float32))
        red.take(p)
    return red


@pytest.mark.parametrize("over,kinds", [
    ({}, ("plain", "none", "sync", FoldPolicy(), "plain", AsTrained)),
    ({"differential_privacy": DP}, ("plain", "dp", "sync", CentralClip(0.5), "plain", Privatize)),
    ({"differential_privacy": {**DP, "mode": "local"}},
     ("plain", "dp", "sync", FoldPolicy(unit_weight=True), "plain", Privatize)),
    ({"secure_aggregation": SA}, ("secure", "none", "secure", FoldPolicy(), "secure", AsTrained)),
    ({"secure_aggregation": SA, "differential_privacy": {**DP, "mode": "distributed"}},
     ("secure", "dp", "secure", FoldPolicy(unit_weight=True), "secure", Privatize)),
])
def test_the_job_file_chooses_every_actors_capabilities(tmp_path, over, kinds):
    job = _job(tmp_path, **over)
    secure, privacy, kind, fold, answer_kind, release = kinds
    assert isinstance(secure_policy(job), SecureRounds if secure == "secure" else PlainRounds)
    with ModelTrail(tmp_path / "trail") as trail:
        assert isinstance(privacy_policy(job, trail), RoundPrivacy if privacy == "dp" else NoRoundPrivacy)
    # before the trail is open the controller draws as without differential privacy (no round is drawn then)
    assert isinstance(privacy_policy(job, None), NoRoundPrivacy)
    assert round_kind(job) == kind and ROUNDS.get(kind) is (SecureRound if kind == "secure" else SyncRound)
    assert fold_policy(job) == fold
    answer = task_answer(job)
    assert isinstance(answer, SecureTraining if answer_kind == "secure" else PlainTraining)
    assert isinstance(answer.release, release)


def test_a_plain_client_encodes_with_the_jobs_codec_and_a_secure_one_masks_words_instead(tmp_path):
    assert task_answer(_job(tmp_path, update_codec="int8_block")).encoder.spec == "int8_block"
    assert task_answer(_job(tmp_path, update_codec="none")).encoder is None
    assert not hasattr(task_answer(_job(tmp_path, secure_aggregation=SA, update_codec="fp16")), "encoder")


def test_plain_rounds_admit_everyone_reduce_means_and_record_nothing():
    plain, red = PlainRounds(), _reduction([A], valid=False)
    plain.after_round(red, "too few updates", 1)
    admitted = plain.admit(2, [A, B], 1)
    assert (admitted.live, admitted.note, admitted.stop) == ([A, B], None, None)
    assert (plain.coded, plain.max_weight, plain.unmask_s, plain.detail(red)) == (False, None, 0.0, {})


def test_secure_rounds_leave_out_a_combiner_whose_sum_on_the_model_was_spent_and_stop_when_none_is_left():
    secure = SecureRounds(SecAggConfig(**SA))
    assert (secure.coded, secure.max_weight, secure.unmask_s) == (True, 1, (UNMASK_STAGES + 1) * 4.0)
    secure.after_round(_reduction([A, B]), None, 1)  # a round that counted spends nothing
    secure.after_round(_reduction([]), "no partial", 1)  # nor one whose combiners revealed nothing
    assert secure.admit(2, [A, B], 1).live == [A, B] and not secure.spent
    secure.after_round(_reduction([A], valid=False), "1 updates < validity.min_updates=99", 1)
    admitted = secure.admit(2, [A, B], 1)
    assert admitted.live == [B] and admitted.stop is None
    assert admitted.note == ("round 2: combiners ['A/0'] already revealed a sum on model version 1 in a round that "
                             "did not count; they sit out rounds on it")
    assert secure.admit(2, [A, B], 2).live == [A, B]  # another model version: A's clients may reveal again
    secure.after_round(_reduction([B], valid=False), "too few", 1)
    stopped = secure.admit(3, [A, B], 1)
    assert stopped.live == [] and stopped.stop.startswith("round 3: no combiner can advance model version 1: A/0, B/0 "
                                                          "already revealed their clients' secure sums on it")
    detail = secure.detail(_reduction([A]))["secure"]
    assert (detail["dropped"], detail["protocol_bytes"], detail["weight"]) == (["z"], [10, 20], 2)


def test_without_differential_privacy_the_draw_is_the_seeds_the_mean_released_and_nothing_spent():
    clients = [Peer("A", 2 + i) for i in range(6)]
    off = NoRoundPrivacy(seed=7, per_round=3)
    assert off.sample(clients, 4) == sorted(random.Random(7 * SEED_STRIDE + 4).sample(clients, 3))
    assert off.sample(clients, 4) == off.sample(clients, 4)  # a restarted controller draws the same
    assert len({tuple(off.sample(clients, r)) for r in range(1, 11)}) > 1  # each round its own draw
    assert NoRoundPrivacy(seed=7).sample(clients, 4) == clients  # no clients_per_round: everyone
    red = _reduction([A])
    assert (off.exhausted(), off.spend(), off.metrics(None), off.detail(), off.detail(None)) == (None, None, {}, {}, {})
    assert off.invalid(red) is None and off.invalid(_reduction([], valid=False)) == "0 updates < validity.min_updates=99"
    np.testing.assert_array_equal(off.release(red)["w"], red.result()["w"])


def test_with_differential_privacy_the_budget_the_draw_and_the_record_are_the_accountants(tmp_path):
    job = _job(tmp_path, clients_per_round=1, differential_privacy={**DP, "sampler": "poisson"})
    with ModelTrail(tmp_path / "trail") as trail:
        on = privacy_policy(job, trail)
        assert on.exhausted() is None and on.detail()["privacy"]["rounds"] == 0
        on.draw_rng = random.Random(1)
        # drawn again until a draw of nobody (none connected either): Poisson at q = 1/population finds one soon
        assert any(not on.sample([], 1) and not on.sampled for _ in range(1000)), "1000 Poisson draws, none empty"
        spent = on.spend()
        assert on.metrics(spent) == {"epsilon": spent["epsilon"], "delta": 1e-5} and spent["epsilon"] > 0
        assert on.detail(spent) == {"privacy": spent} and on.detail()["privacy"]["rounds"] == 1
        assert on.invalid(_reduction([], valid=False)).startswith("the sampler drew no client: the round is skipped")
        assert on.invalid(_reduction([A])) is None  # a valid reduction is valid whatever was drawn
    tight = _job(tmp_path / "t", differential_privacy={**DP, "target_epsilon": 1e-6})
    with ModelTrail(tmp_path / "t" / "trail") as trail:
        assert "target_epsilon" in privacy_policy(tight, trail).exhausted()


def test_the_combiner_folds_as_it_came_without_central_dp_and_clips_to_clip_norm_with_it():
    change = np.array([3.0, -4.0], np.float32)  # norm 5
    as_came = FoldPolicy()
    pieces, detail = as_came.clip(5.0, iter([("w", 0, change)]), None)
    assert detail == {} and not as_came.measures and not as_came.unit_weight
    np.testing.assert_array_equal(next(pieces)[2], change)
    assert as_came.round_records(3, 0) == [] and FoldPolicy(unit_weight=True).unit_weight

    clip = CentralClip(0.5)
    assert clip.measures and clip.unit_weight
    pieces, detail = clip.clip(5.0, iter([("w", 0, change)]), None)  # (coded: the pieces are the change)
    assert detail == {"clipped": True, "clip_norm": 0.5}
    assert np.linalg.norm(next(pieces)[2]) == pytest.approx(0.5, rel=1e-6)
    _, within = clip.clip(0.5 * (1 + CLIP_SLACK / 2), iter([]), None)  # rounding over clip_norm: not counted
    assert within == {}
    for bad in (float("inf"), float("nan")):
        with pytest.raises(ValueError, match="not finite"):
            clip.clip(bad, iter([("w", 0, change)]), None)
    assert clip.round_records(3, 2) == [("fl.dp", "clipped", {"round": 3, "clipped": 2, "clip_norm": 0.5})]
    with pytest.raises(ValueError, match="clip_norm=0"):
        CentralClip(0.0)


class _Model:
    """A client's model that trains to a fixed change and evaluates to fixed metrics (counting its evaluations)."""

    def __init__(self) -> None:
        self.evaluated = 0

    def evaluate(self, params, config):
        self.evaluated += 1
        return 0.25, 8, {"accuracy": 0.5}


def test_a_clients_update_leaves_as_trained_without_dp_and_clipped_noised_and_without_metrics_with_it(tmp_path):
    params = {"w": np.zeros(2, np.float32)}
    trained = {"w": np.array([3.0, 4.0], np.float32)}
    model, off = _Model(), AsTrained()
    evaluated = off.evaluation(model.evaluate, params, {})
    assert evaluated == {"eval_loss": 0.25, "eval_examples": 8, "accuracy": 0.5} and model.evaluated == 1
    assert off.metrics(evaluated, {"train_loss": 1.0}) == {**evaluated, "train_loss": 1.0}
    assert off.weights(params, trained) is trained and off.change(trained["w"], 3) is trained["w"]

    job = _job(tmp_path, differential_privacy={**DP, "mode": "local", "noise_multiplier": 1e-12})
    on = task_answer(job).release
    assert on.evaluation(model.evaluate, params, {}) == {} and model.evaluated == 1  # never evaluated
    assert on.metrics({}, {"train_loss": 1.0}) is None
    sent = on.weights(params, trained)["w"]
    assert np.linalg.norm(sent) == pytest.approx(0.5, rel=1e-5) and sent.dtype == np.float32
    assert np.linalg.norm(on.change(np.array([30.0, 40.0]), 3)) == pytest.approx(0.5, rel=1e-5)
    with pytest.raises(ValueError, match="nothing is sent"):
        on.weights(params, {"v": trained["w"]})
