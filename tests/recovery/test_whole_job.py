"""Whole-job recovery end to end, fast: two clusters of one rank each run the toy pipeline through real switch
servers; every process of cluster B is killed (SIGKILL) mid-run and B is launched again as it was. Cluster A is
left alone: it stops at its boundary, both agree on the newest checkpoint both hold, and the job finishes with
the losses of an uninterrupted run. (Each launched mode with `nebula launch` and 2 ranks per cluster, and a switch
host restart: test_whole_job_slow.py.)"""
from __future__ import annotations

import pytest

from nebula.config.job import load_job_config
from nebula.modes import run
from testbed.federation import start_switches
from tests.pipeline.helpers import toy_job
from testbed.clusters import (EVERY, events, kill_cluster, metrics, recovery_job, redone, same_loss_each_time,
                                     start_rank, wait_steps)

STEPS = 40


def test_a_killed_cluster_launched_again_resumes_the_job_with_the_uninterrupted_losses(procs, tmp_path):
    workers = start_switches(procs, tmp_path / "fed", ["A", "B"])
    job = recovery_job(tmp_path, "pipeline", workers, steps=STEPS, peer_timeout_s=3)
    a = start_rank(procs, job, "A", tmp_path / "A.log")
    b = start_rank(procs, job, "B", tmp_path / "B.log")
    wait_steps(tmp_path, "B", 2 * EVERY + 2, 120, [a, b])
    kill_cluster(b)  # every process of cluster B, at once
    b = start_rank(procs, job, "B", tmp_path / "B.log")  # B's launcher launches it again; nothing is done at A
    assert a.wait(180) == 0, (tmp_path / "A.log").read_text()[-3000:]
    assert b.wait(60) == 0, (tmp_path / "B.log").read_text()[-3000:]

    recovered = [e for e in events(tmp_path, "A") if e["event"] == "recovered"]
    assert len(recovered) == 1, events(tmp_path, "A")
    resumed = recovered[0]["step"]
    relaunch = events(tmp_path, "B")[-1]
    assert relaunch["event"] == "started" and relaunch["launch"] == 2 and relaunch["step"] == resumed
    assert relaunch["tag"] == recovered[0]["tag"]  # one round, the same new channels on both sides
    assert resumed >= 2 * EVERY and resumed % EVERY == 0
    assert 0 <= redone(tmp_path, "AB", recovered[0]) <= EVERY

    losses = same_loss_each_time(metrics(tmp_path, "B"))  # redone steps: the losses they had the first time
    assert sorted(losses) == list(range(STEPS))
    (tmp_path / "ref").mkdir()
    ref = run(load_job_config(toy_job(tmp_path / "ref", steps=STEPS, clusters=[{"id": "A"}],
                                      stages=[{"name": "embed", "cluster": "A"}, {"name": "head", "cluster": "A"}])),
              "A").losses
    for s in range(STEPS):
        assert losses[s] == pytest.approx(ref[s], rel=1e-5, abs=1e-6), (s, losses[s], ref[s])


def test_recovery_needs_checkpoints_to_resume_from(tmp_path):
    job = toy_job(tmp_path, clusters=[{"id": "A"}, {"id": "B"}], stages=[{"name": "embed", "cluster": "A"},
                                                                        {"name": "head", "cluster": "B"}],
                  recovery_timeout_s=60, checkpoint={"dir": "ckpt"})
    with pytest.raises(Exception, match=r"recovery_timeout_s=60 resumes every cluster from a common checkpoint: "
                                        r"set checkpoint.dir, checkpoint.every > 0"):
        load_job_config(job)
