"""The initial model: checked like an update (names, dtypes, size, finite values) and agreed by several clients, so
that one silent or hostile client can neither stall nor poison the start; or named in the job file."""
from __future__ import annotations

import json

import numpy as np
import pytest

from nebula.federated.config import load_federated_job
from nebula.federated.initial import Answer, load_initial_model, majority, manifest_refusal
from nebula.federated.controller.trail import ModelTrail
from testbed.fedjob import federation, run_job, write_job

W = ("w", "float32", (4, 3))
B = ("b", "float32", (3,))


def test_the_manifest_more_than_half_of_the_valid_answers_share_wins():
    honest, other = (W, B), (W, B, ("backdoor", "float32", (7,)))
    assert majority([Answer("A/2", honest), Answer("A/3", None, "NaN"), Answer("B/2", None, "silent")]) == honest
    assert majority([Answer("A/2", honest), Answer("A/3", other)]) is None  # a tie: ask another client
    assert majority([Answer("A/2", honest), Answer("A/3", other), Answer("B/2", honest)]) == honest
    assert majority([Answer("A/2", None, "NaN")]) is None
    # with 2 of 5 answers in, 2 agreeing is no majority yet (3 more could outvote them); 3 are
    assert majority([Answer("A/2", honest), Answer("B/2", honest)], of=5) is None
    assert majority([Answer(c, honest) for c in ("A/2", "B/2", "B/3")], of=5) == honest


@pytest.fixture
def job(tmp_path):
    return load_federated_job(write_job(tmp_path, {"A": tmp_path / "w.yaml"}, {"A": 1}, max_model_bytes=1024))


@pytest.mark.parametrize("tensors,needle", [
    ([["w", "float64", [4, 3]]], "tensor 'w' has dtype float64, the job's model_dtypes are ['float32']"),
    ([["w", "float32", [4, 3]], ["w", "float32", [3]]], "tensor 'w' is listed twice"),
    ([["w", "float32", [10**12, 10**12]]], "larger than the job's max_model_bytes=1024"),
    ([["w", "float32", [-1]]], "malformed tensor entry"),
    ([["w", "object", [1]]], "has dtype object"),
    ([], "must list 1 to"),
    ("w", "must list 1 to"),
])
def test_a_model_whose_manifest_the_job_does_not_allow_is_refused_before_any_piece(job, tensors, needle):
    assert needle in manifest_refusal(tensors, job)


def test_an_initial_model_file_is_checked_like_an_update(tmp_path):
    f = tmp_path / "init.npz"
    np.savez(f, w=np.full((4, 3), 0.5, np.float32), b=np.zeros(3, np.float32))
    job = load_federated_job(write_job(tmp_path, {"A": tmp_path / "w.yaml"}, {"A": 1}, initial_model="init.npz"))
    assert job.initial_model == str(f)  # resolved against the job file
    assert load_initial_model(job)["w"][0, 0] == 0.5
    np.savez(f, w=np.full((4, 3), np.nan, np.float32))
    with pytest.raises(ValueError, match=r"initial_model .*init.npz: 'w' holds NaN or Inf"):
        load_initial_model(job)
    np.savez(f, w=np.zeros(3, np.float64))
    with pytest.raises(ValueError, match="has dtype float64"):
        load_initial_model(job)
    f.write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="cannot read it as .npz"):
        load_initial_model(job)


def test_a_nan_a_float64_backdoor_and_a_silent_client_neither_poison_nor_stall_the_start(procs, tmp_path):
    workers = federation(procs, tmp_path)
    behaviours = {"A/0": "init_nan", "A/1": "init_backdoor", "B/0": "init_silent"}
    job = write_job(tmp_path, workers, {"A": 2, "B": 2}, rounds=1, initial_clients=4, initial_wait_s=2,
                    validity={"min_updates": 4},
                    client={"factory": "testbed.toy_client:make_client",
                            "args": {"behaviours": behaviours, "sleep_s": {"B/0": 2.5}}})
    out = run_job(procs, job)
    with ModelTrail(tmp_path / "fl" / "trail") as t:
        models, rounds = t.models(), t.rounds()
        first, _ = t.load(1)
    # version 1 is the honest client's model (B/1 is rank 3), and every client trains from it
    assert models[0].clients == ["B/3"] and sorted(first) == ["b", "w"], out
    assert all(v.dtype == np.float32 and not v.any() for v in first.values())
    assert [(r.status, r.num_updates) for r in rounds] == [("valid", 4)]
    audit = [json.loads(line) for line in (tmp_path / "fl" / "controller" / "audit.log").read_text().splitlines()]
    initial = {r["target"]: (r["outcome"], r["detail"].get("reason")) for r in audit if r["action"] == "fl.initial"}
    assert initial["A/2"] == ("refused", "'w' holds NaN or Inf")
    assert initial["A/3"][0] == "refused" and "has dtype float64" in initial["A/3"][1]
    assert initial["B/2"] == ("silent", "no answer within initial_wait_s=2")
    assert initial["B/3"][0] == "accepted"
