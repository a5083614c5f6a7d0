"""A peer cluster that dies: clear report, clean exit after the timeout, and a restart that resumes exactly."""
from __future__ import annotations

import dataclasses
import os
import signal
import time

import pytest
import yaml

from nebula.config.job import load_job_config
from nebula.pipeline import read_metrics, replace_steps
from nebula.modes import run
from testbed.federation import finish, launch, start_switches
from tests.pipeline.helpers import TWO_STAGES, toy_job

LOCAL = [{"name": "embed", "cluster": "A"}, {"name": "head", "cluster": "A"}]


def _wait_lines(path, n, timeout_s):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and len(path.read_text().splitlines()) >= n:
            return
        time.sleep(0.2)
    raise AssertionError(f"{path} did not reach {n} lines in {timeout_s} s")


@pytest.mark.slow
def test_dead_peer_is_reported_then_restart_resumes_from_common_checkpoint(procs, tmp_path):
    workers = start_switches(procs, tmp_path / "fed", ["A", "B"])
    job = toy_job(tmp_path, steps=100000, stages=TWO_STAGES, peer_timeout_s=4,
                  checkpoint={"dir": "ckpt", "every": 5, "keep": 2},
                  clusters=[{"id": "A", "worker": str(workers["A"])}, {"id": "B", "worker": str(workers["B"])}])
    pa, pb = launch(procs, job, "A"), launch(procs, job, "B")
    _wait_lines(tmp_path / "metrics" / "B.rank0.jsonl", 12, 120)
    os.killpg(pb.pid, signal.SIGKILL)  # cluster B dies: its launcher and every rank
    pb.wait(10)
    t0 = time.monotonic()
    code, out = finish(pa, 120)
    assert code != 0
    assert "nebula: peer cluster B lost: " in out and "gave up after 4 s (peer_timeout_s=4)" in out, out[-3000:]
    assert "resume from the last common checkpoint" in out
    assert time.monotonic() - t0 < 60
    done_b = len(read_metrics(tmp_path / "metrics" / "B.rank0.jsonl"))

    doc = yaml.safe_load(job.read_text())
    doc["train"]["steps"] = done_b + 6
    job.write_text(yaml.safe_dump(doc))
    pa, pb = launch(procs, job, "A"), launch(procs, job, "B")
    (ca, outa), (cb, outb) = finish(pa, 180), finish(pb, 180)
    assert ca == 0 and cb == 0, outa[-3000:] + outb[-3000:]
    recs = read_metrics(tmp_path / "metrics" / "B.rank0.jsonl")[done_b:]
    resumed = recs[0]["step"]
    assert resumed % 5 == 0 and done_b - 7 <= resumed <= done_b  # the newest checkpoint both clusters had
    assert [r["step"] for r in recs] == list(range(resumed, done_b + 6))
    a_first = read_metrics(tmp_path / "metrics" / "A.rank0.jsonl")
    assert resumed in [r["step"] for r in a_first]

    (tmp_path / "ref").mkdir()
    ref_cfg = load_job_config(toy_job(tmp_path / "ref", steps=done_b + 6, clusters=[{"id": "A"}], stages=LOCAL))
    ref = run(ref_cfg, "A").losses
    for r in recs:
        assert r["loss"] == pytest.approx(ref[r["step"]], rel=1e-5, abs=1e-6)


@pytest.mark.slow
def test_hot_start_inter_cluster_run_from_intra_cluster_checkpoint(procs, tmp_path):
    """Hot start, two stages in one cluster, and compression from its start step, through real switches."""
    local3 = [{"name": "embed", "cluster": "A"}, {"name": "mid1", "cluster": "A"}, {"name": "head", "cluster": "A"}]
    (tmp_path / "pre").mkdir()
    pre = load_job_config(toy_job(tmp_path / "pre", steps=8, clusters=[{"id": "A"}], stages=local3,
                                  recipe_args={"num_stages": 3}, checkpoint={"dir": "ckpt"}))
    no_ckpt = dataclasses.replace(pre, checkpoint=dataclasses.replace(pre.checkpoint, dir=None))
    ref = run(replace_steps(no_ckpt, 12), "A").losses  # the uninterrupted reference
    run(pre, "A")  # the "88,000 steps inside one cluster" part, saved at step 8
    workers = start_switches(procs, tmp_path / "fed", ["A", "B"])
    job = toy_job(tmp_path, steps=12, peer_timeout_s=3, recipe_args={"num_stages": 3},
                  stages=[{"name": "embed", "cluster": "A"}, {"name": "mid1", "cluster": "A"},
                          {"name": "head", "cluster": "B"}],
                  compression={"forward": "fp16", "backward": "int8", "start_step": 10},
                  checkpoint={"init_from": str(tmp_path / "pre" / "ckpt" / "step_00000008")},
                  clusters=[{"id": "A", "worker": str(workers["A"])}, {"id": "B", "worker": str(workers["B"])}])
    pa = launch(procs, job, "A")
    time.sleep(6)  # B starts later than A's peer timeout: the start barrier waits startup_timeout_s instead
    pb = launch(procs, job, "B")
    (ca, outa), (cb, outb) = finish(pa, 180), finish(pb, 180)
    assert ca == 0 and cb == 0, outa[-3000:] + outb[-3000:]
    recs = {r["step"]: r for r in read_metrics(tmp_path / "metrics" / "B.rank0.jsonl")}
    assert sorted(recs) == [8, 9, 10, 11]
    for s in (8, 9):  # uncompressed before compression.start_step: exact
        assert recs[s]["loss"] == pytest.approx(ref[s], rel=1e-5, abs=1e-6)
    for s in (10, 11):  # fp16 activations, int8 gradients: close
        assert recs[s]["loss"] == pytest.approx(ref[s], rel=2e-2)
    # int8 gradients (B -> A) are about a quarter of the float32 ones
    assert recs[11]["bytes_sent"] < 0.5 * recs[8]["bytes_sent"]
