"""Two clusters through real switch servers and real paddle.distributed.launch process groups."""
from __future__ import annotations


import pytest

from nebula.config.job import load_job_config
from nebula.pipeline import read_metrics
from nebula.modes import run
from testbed.federation import finish, launch, start_switches
from tests.pipeline.helpers import TWO_STAGES, toy_job

STEPS = 20


@pytest.mark.slow
def test_two_clusters_two_ranks_each_match_single_process(procs, tmp_path):
    """Invariant: same seed and config, codec none -> same losses as one process, for 20 steps."""
    workers = start_switches(procs, tmp_path / "fed", ["A", "B"])
    job = toy_job(tmp_path, steps=STEPS, stages=TWO_STAGES, peer_timeout_s=60,
                  clusters=[{"id": "A", "procs_per_node": 2, "worker": str(workers["A"])},
                            {"id": "B", "procs_per_node": 2, "worker": str(workers["B"])}])
    pa, pb = launch(procs, job, "A"), launch(procs, job, "B")
    (ca, outa), (cb, outb) = finish(pa, 240), finish(pb, 240)
    assert ca == 0 and cb == 0, outa[-3000:] + outb[-3000:]
    (tmp_path / "ref").mkdir()
    ref_job = toy_job(tmp_path / "ref", steps=STEPS,
                      clusters=[{"id": "A"}], stages=[{"name": "embed", "cluster": "A"}, {"name": "head", "cluster": "A"}])
    ref = run(load_job_config(ref_job), "A").losses
    got = {r["step"]: r["loss"] for r in read_metrics(tmp_path / "metrics" / "B.rank0.jsonl")}
    assert sorted(got) == list(range(STEPS))
    for s in range(STEPS):
        assert got[s] == pytest.approx(ref[s], rel=1e-5, abs=1e-6), (s, got[s], ref[s])
    assert ref[STEPS - 1] < ref[0]  # it trains
    for cluster in ("A", "B"):
        for rank in (0, 1):
            recs = read_metrics(tmp_path / "metrics" / f"{cluster}.rank{rank}.jsonl")
            assert len(recs) == STEPS
            # per step: 2 micro-batches of [4, 32] float32 plus headers (arrivals may be counted a step late)
            assert sum(r["bytes_sent"] for r in recs) >= STEPS * 2 * 4 * 32 * 4
            assert sum(r["bytes_recv"] for r in recs) >= STEPS * 2 * 4 * 32 * 4
            assert all(r["step_s"] >= r["wait_s"] >= 0 for r in recs)
    a_recs = read_metrics(tmp_path / "metrics" / "A.rank0.jsonl")
    # activations (A->B) and gradients (B->A) have the same size with codec none
    assert sum(r["bytes_sent"] for r in a_recs) > 0.9 * sum(r["bytes_recv"] for r in a_recs)


@pytest.mark.slow
def test_two_clusters_two_ranks_each_with_stale_weights_compute_the_delayed_update(procs, tmp_path):
    """train.stale_weights: 1 through real switches and two ranks per cluster: the losses of the delayed update
    rule computed in one process (tests/pipeline/test_stale_weights.py), with drains at the checkpoints."""
    from tests.pipeline.helpers import stale_reference
    from tests.pipeline.test_stale_weights import EVERY, MBS, STEPS as S

    workers = start_switches(procs, tmp_path / "fed", ["A", "B"])
    job = toy_job(tmp_path, steps=S, stages=TWO_STAGES, peer_timeout_s=60, micro_batches=MBS,
                  recipe_args={"depth": 1}, checkpoint={"dir": "ck", "every": EVERY},
                  clusters=[{"id": "A", "procs_per_node": 2, "worker": str(workers["A"])},
                            {"id": "B", "procs_per_node": 2, "worker": str(workers["B"])}])
    job.write_text(job.read_text().replace("seed: 3", "seed: 3\n  stale_weights: 1"))
    pa, pb = launch(procs, job, "A"), launch(procs, job, "B")
    (ca, outa), (cb, outb) = finish(pa, 240), finish(pb, 240)
    assert ca == 0 and cb == 0, outa[-3000:] + outb[-3000:]
    cfg = load_job_config(job)
    ref = stale_reference(cfg, tmp_path / "ref")
    got = {r["step"]: r["loss"] for r in read_metrics(tmp_path / "metrics" / "B.rank0.jsonl")}
    assert sorted(got) == list(range(S))
    for s in range(S):
        assert got[s] == pytest.approx(ref[s], rel=1e-5, abs=1e-6), (s, got[s], ref[s])
