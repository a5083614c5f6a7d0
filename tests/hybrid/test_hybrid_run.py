"""Hybrid DP x PP inside one cluster under real paddle.distributed.launch: the unpartitioned model's losses."""
from __future__ import annotations

import pytest

from nebula.pipeline import read_metrics
from tests.hybrid.helpers import assert_same_losses, hybrid_job, losses_of, reference_losses, run_cluster


def test_two_stage_pipeline_gives_the_unpartitioned_losses(procs, tmp_path):
    """2 ranks = 2 stages x 1 replica, layers cut at 2 of 6: activations and gradients cross ranks over gloo."""
    job = hybrid_job(tmp_path, ranks=2, pipeline={"num_stages": 2, "bounds": [0, 2, 6]}, steps=2)
    run_cluster(procs, job)
    ref = reference_losses(steps=2)
    for rank in (0, 1):  # every rank learns the step's loss
        assert_same_losses(losses_of(tmp_path / "metrics" / f"A.rank{rank}.jsonl"), ref, range(2))
    recs = read_metrics(tmp_path / "metrics" / "A.rank1.jsonl")
    assert {r["stage"] for r in recs} == {1} and recs[0]["bounds"] == [0, 2, 6]
    assert all(r["wait_s"] > 0 for r in recs)  # the last stage waited for activations from rank 0


@pytest.mark.slow
def test_two_stages_by_two_replicas_with_allocation_gives_the_unpartitioned_losses(procs, tmp_path):
    """4 ranks = 2 stages x 2 replicas; the ranks benchmark themselves and the optimal allocator cuts the layers."""
    job = hybrid_job(tmp_path, ranks=4, pipeline={"num_stages": 2, "allocation": "optimal"}, steps=3)
    run_cluster(procs, job)
    ref = reference_losses(steps=3)
    recs = {r: read_metrics(tmp_path / "metrics" / f"A.rank{r}.jsonl") for r in range(4)}
    assert [recs[r][0]["stage"] for r in range(4)] == [0, 1, 0, 1]
    assert [recs[r][0]["replica"] for r in range(4)] == [0, 0, 1, 1]
    bounds = recs[0][0]["bounds"]
    assert all(recs[r][0]["bounds"] == bounds for r in range(4)) and recs[0][0]["method"] == "optimal"
    for r in range(4):
        assert_same_losses(losses_of(tmp_path / "metrics" / f"A.rank{r}.jsonl"), ref, range(3))
