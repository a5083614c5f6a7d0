"""The combiner's checks on an update: every refusal reason of its header, and example counts and changes bounded by
the job through real switches."""
from __future__ import annotations

import json

import numpy as np
import pytest

from nebula.federated.checks import check_update_header
from nebula.federated.config import load_federated_job
from nebula.federated.intake import change_sumsq
from nebula.federated.controller.trail import ModelTrail
from testbed.fedjob import federation, run_job, write_job

TENSORS = [["w", "float32", [4, 3]], ["b", "float32", [3]]]


def _check(**over):
    head = {"type": "update", "job": "j", "round": 5, "version": 7, "num_examples": 10, "tensors": TENSORS}
    head.update(over)
    why = check_update_header(head, job="j", round=5, version=7, known_version=7, expected={"A/2", "B/2"},
                              seen={"B/2"}, who="A/2", tensors=TENSORS, max_examples=1000)
    return None if why is None else str(why)


def test_a_good_update_passes():
    assert _check() is None


@pytest.mark.parametrize("over,needle", [
    ({"job": "other"}, "belongs to job 'other'"),
    ({"version": 9}, "future model version 9"),
    ({"version": 0}, "unknown model version 0"),
    ({"version": "x"}, "unknown model version 'x'"),
    ({"round": 4, "version": 6}, "late: trained for round 4 from version 6"),
    ({"num_examples": 0}, "num_examples=0"),
    ({"num_examples": 10**15}, "num_examples=1000000000000000 exceeds the job's max_examples_per_client=1000"),
    ({"num_examples": True}, "num_examples=True"),
    ({"tensors": [["w", "float32", 4], TENSORS[1]]}, "malformed tensors list"),
    ({"tensors": [[f"x{i}", "float32", [1]] for i in range(1000)]}, "and 995 more"),
    ({"tensors": TENSORS[:1]}, "missing ['b']"),
    ({"tensors": [["w", "float64", [4, 3]], TENSORS[1]]}, "'w' has dtype float64, expected float32"),
    ({"tensors": [["w", "float32", [5, 3]], TENSORS[1]]}, "'w' has shape (5, 3), expected (4, 3)"),
])
def test_bad_headers_are_refused_with_their_reason(over, needle):
    assert needle in _check(**over)


def test_duplicates_and_uninvited_clients_are_refused():
    ok = {"type": "update", "job": "j", "round": 5, "version": 7, "num_examples": 10, "tensors": TENSORS}
    kw = dict(job="j", round=5, version=7, known_version=7, expected={"A/2", "B/2"}, tensors=TENSORS,
              max_examples=1000)
    dup = check_update_header(ok, seen={"B/2"}, who="B/2", **kw)
    assert dup.kind == "duplicate" and "duplicate update in round 5" in str(dup)
    assert "not asked to take part" in str(check_update_header(ok, seen=set(), who="C/9", **kw))


def test_huge_example_counts_and_huge_changes_are_refused_and_never_move_the_model(procs, tmp_path):
    workers = federation(procs, tmp_path)
    # A/1 claims 10^15 examples for weights of -1000; A/2 sends finite values near float32's largest; B/0 sends
    # weights of -1000 claiming its real 200 examples: only the job's max_update_norm tells it from an honest one
    behaviours = {"A/1": "huge_n", "A/2": "huge_values", "B/0": "scale"}
    job = write_job(tmp_path, workers, {"A": 3, "B": 2}, rounds=2, max_update_norm=100.0,
                    validity={"min_updates": 2}, client={"factory": "testbed.toy_client:make_client",
                                                         "args": {"behaviours": behaviours}})
    out = run_job(procs, job)
    with ModelTrail(tmp_path / "fl" / "trail") as t:
        rounds, models = t.rounds(), t.models()
        weights = [t.load(m.version)[0] for m in models]
    assert [(r.status, r.num_updates) for r in rounds] == [("valid", 2), ("valid", 2)], out
    assert all(m.clients == ["A/2", "B/3"] for m in models[1:])
    assert all(np.abs(w[k]).max() < 50 for w in weights for k in w)  # the honest clients' model, nowhere near -1000
    assert 0 < rounds[0].detail["update_norm_max"] < 100  # what the honest changes measured
    for r in rounds:
        why = {x["client"]: x["reason"] for x in r.rejected}
        assert "num_examples=1000000000000000 exceeds the job's max_examples_per_client=1000000" in why["A/3"]
        assert "L2 norm over the job's max_update_norm=100" in why["A/4"]
        assert "L2 norm over the job's max_update_norm=100" in why["B/2"]
    audit = [json.loads(line) for line in (tmp_path / "fl" / "combiner-A" / "audit.log").read_text().splitlines()]
    refused = [(r["target"], r["detail"]["round"]) for r in audit if r["action"] == "fl.update"
               and r["outcome"] == "refused"]
    assert sorted(refused) == [("A/3", 1), ("A/3", 2), ("A/4", 1), ("A/4", 2)]


def test_the_default_bounds_refuse_the_attacks_values(tmp_path):
    job = load_federated_job(write_job(tmp_path, {"A": tmp_path / "w.yaml"}, {"A": 1}))
    assert job.max_examples_per_client == 10**6 and job.max_update_norm == 1e6
    # 3e38 in even one of the toy model's 15 values is a change of norm 3e38
    assert np.sqrt(change_sumsq(np.full(15, 3e38, np.float32), np.zeros(15, np.float32))) > job.max_update_norm
