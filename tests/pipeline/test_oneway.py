"""Scenario I pattern: one-way flow, root scatter to k receivers, sync tensor after every step."""
from __future__ import annotations

import pytest

from nebula.config.job import load_job_config
from nebula.pipeline import read_metrics
from nebula.modes import run
from testbed.federation import finish, launch, start_switches
from tests.pipeline.helpers import toy_job

STEPS = 8


@pytest.mark.slow
def test_one_sender_feeds_two_receivers_and_matches_one_process(procs, tmp_path):
    workers = start_switches(procs, tmp_path / "fed", ["A", "B"])
    job = toy_job(tmp_path, steps=STEPS, mode="oneway", oneway={"k": 2, "sync_lag": 1},
                  recipe_args={"oneway": True}, peer_timeout_s=60,
                  stages=[{"name": "gen", "cluster": "A"}, {"name": "disc", "cluster": "B"}],
                  clusters=[{"id": "A", "procs_per_node": 1, "worker": str(workers["A"])},
                            {"id": "B", "procs_per_node": 2, "worker": str(workers["B"])}])
    pa, pb = launch(procs, job, "A"), launch(procs, job, "B")
    (ca, outa), (cb, outb) = finish(pa, 240), finish(pb, 240)
    assert ca == 0 and cb == 0, outa[-3000:] + outb[-3000:]
    gen = read_metrics(tmp_path / "metrics" / "A.rank0.jsonl")
    disc = read_metrics(tmp_path / "metrics" / "B.rank0.jsonl")
    sub = read_metrics(tmp_path / "metrics" / "B.rank1.jsonl")
    assert [r["step"] for r in gen] == [r["step"] for r in disc] == [r["step"] for r in sub] == list(range(STEPS))
    # one-way: the sender never receives activations or gradients, only the small sync tensors
    assert sum(r["bytes_recv"] for r in gen) < 300 * STEPS  # a 16-byte sync tensor plus headers per step
    assert sum(r["bytes_sent"] for r in gen) > 0
    assert all(r["bytes_sent"] == 0 and r["bytes_recv"] == 0 for r in sub)  # fed through the root's scatter

    (tmp_path / "ref").mkdir()
    ref_cfg = load_job_config(toy_job(tmp_path / "ref", steps=STEPS, recipe_args={"oneway": True},
                                      clusters=[{"id": "A"}],
                                      stages=[{"name": "gen", "cluster": "A"}, {"name": "disc", "cluster": "A"}]))
    ref = run(ref_cfg, "A").losses  # in one process both losses are summed
    for g, d in zip(gen, disc):
        assert g["loss"] + d["loss"] == pytest.approx(ref[g["step"]], rel=1e-5, abs=1e-6)
