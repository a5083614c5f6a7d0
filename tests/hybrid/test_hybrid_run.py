"""Hybrid DP x PP inside one cluster under real paddle.distributed.launch: the unpartitioned model's losses."""
from __future__ import annotations

import pytest

from nebula.config.job import load_job_config
from nebula.hybrid.checkpoint import committed_steps
from nebula.pipeline.checkpoint import read_step_marker
from nebula.launch.elastic import relayout
from nebula.hybrid.runner import run_hybrid
from nebula.pipeline import read_metrics, replace_steps
from tests.hybrid.helpers import assert_same_losses, hybrid_job, losses_of, reference_losses, run_cluster

# printed in README.md ("Layer pipelines from an allocation"); run as printed, in the job's directory, by
# test_rank_killed_mid_run_relaunches_on_reallocated_layout_and_trains_on
PRINTED = ["nebula launch job.yaml --cluster A --elastic"]


def test_two_stage_pipeline_gives_the_unpartitioned_losses_and_resumes_on_one_rank(procs, tmp_path):
    """2 ranks = 2 stages x 1 replica, layers cut at 2 of 6: activations and gradients cross ranks over gloo.
    Then one rank is gone: the per-layer checkpoint loads into a one-stage layout that trains on exactly."""
    job = hybrid_job(tmp_path, ranks=2, pipeline={"num_stages": 2, "bounds": [0, 2, 6]}, steps=2,
                     checkpoint={"dir": "ck"})
    run_cluster(procs, job)
    ref = reference_losses(steps=4)
    for rank in (0, 1):  # every rank learns the step's loss
        assert_same_losses(losses_of(tmp_path / "metrics" / f"A.rank{rank}.jsonl"), ref, range(2))
    recs = read_metrics(tmp_path / "metrics" / "A.rank1.jsonl")
    assert {r["stage"] for r in recs} == {1} and recs[0]["bounds"] == [0, 2, 6]
    assert all(r["wait_s"] > 0 for r in recs)  # the last stage waited for activations from rank 0
    assert committed_steps(tmp_path / "ck", "A", 6) == [2]
    assert read_step_marker(tmp_path / "ck", 2, "A")["bounds"] == [0, 2, 6]

    cfg = relayout(load_job_config(job), "A", 1, 6)  # one rank left: a new layout, the cut re-allocated
    assert cfg.cluster("A").pipeline.num_stages == 1 and cfg.cluster("A").pipeline.bounds is None
    res = run_hybrid(replace_steps(cfg, 4), "A")
    assert res.start_step == 2
    assert_same_losses(res.losses, ref, range(2, 4))


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


@pytest.mark.slow
@pytest.mark.readme
def test_rank_killed_mid_run_relaunches_on_reallocated_layout_and_trains_on(procs, tmp_path):
    """4 ranks (2 x 2, cut by `optimal` on layer costs rank 0 measured) train; rank 1 is killed after a checkpoint;
    `nebula launch --elastic` finds that rank 1 left, re-allocates with nebula.balance.reallocate for ranks 0, 2, 3
    as 3 stages (the fewest layer bytes moved among optimal cuts; each keeps its slowdown) and relaunches them on
    that cut; they resume from the last committed step and finish with the reference losses."""
    import json
    import os
    import shlex
    import signal
    import time

    from nebula.balance import DeviceProfile, LayerCost
    from nebula.hybrid import Layout
    from nebula.launch.elastic import reallocate_layout
    from testbed.federation import BIN, finish

    steps = 10
    job = hybrid_job(tmp_path, ranks=4, steps=steps, checkpoint={"dir": "ck", "every": 1},
                     pipeline={"num_stages": 2, "allocation": "optimal", "probe": False,
                               "slowdown": [200.0, 1.0, 1.0, 2.0]})
    assert job == tmp_path / "job.yaml"
    words = shlex.split(PRINTED[0])
    p = procs.start([str(BIN / words[0]), *words[1:]], cwd=str(tmp_path))
    rank1 = tmp_path / "metrics" / "A.rank1.jsonl"
    deadline = time.monotonic() + 180
    while not committed_steps(tmp_path / "ck", "A", 6) or not rank1.is_file() or not rank1.read_text().strip():
        assert p.poll() is None and time.monotonic() < deadline, "the job ended before a checkpoint was committed"
        time.sleep(0.1)
    killed_after = committed_steps(tmp_path / "ck", "A", 6)[-1]
    first_bounds = read_metrics(rank1)[0]["bounds"]
    os.kill(read_metrics(rank1)[0]["pid"], signal.SIGKILL)
    code, out = finish(p, 240)
    assert code == 0, out[-4000:]
    assert "lost rank(s) 1 (exit" in out and "relaunching 3 rank(s) as 3 stage(s) x 1 replica(s)" in out
    assert killed_after < steps, "the kill came after training had finished"

    # the relaunch's cut is reallocate's, recomputed here from the same measurements
    doc = json.loads((tmp_path / "job.ranks3.realloc.json").read_text())
    assert doc["old_bounds"] == first_bounds and doc["old_layout"] == [2, 2] and doc["layout"] == [3, 1]
    assert doc["survivors"] == [0, 2, 3]
    assert load_job_config(tmp_path / "job.ranks3.yaml").cluster("A").pipeline.slowdown == (200.0, 1.0, 2.0)
    costs, devices = [LayerCost(**c) for c in doc["costs"]], [DeviceProfile(**d) for d in doc["devices"]]
    again = reallocate_layout(Layout(2, 2), first_bounds, costs, devices, 3, "optimal", doc["survivors"])
    assert again.bounds == doc["bounds"] and again.moved_bytes == pytest.approx(doc["moved_bytes"])
    assert doc["seconds"] < 5.0 and 0 < doc["moved_bytes"] < doc["total_bytes"]
    assert f"reallocate (optimal) cut {first_bounds} -> {doc['bounds']}" in out
    ref = reference_losses(steps=steps)
    recs = read_metrics(tmp_path / "metrics" / "A.rank2.jsonl")
    after = [r for r in recs if r["bounds"] != first_bounds]  # the relaunched layout's records
    assert after and all(r["bounds"] == doc["bounds"] and r["stage"] == 2 for r in after)
    resumed = after[0]["step"]
    assert resumed >= killed_after and after[-1]["step"] == steps - 1
    assert f"from checkpoint step {resumed} " in out  # resumed from the step the relaunch was planned at
    assert_same_losses({r["step"]: r["loss"] for r in after}, ref, range(resumed, steps))
