"""Streaming DiLoCo through real switch servers (`nebula launch` per cluster, TLS between the switches, the toy
recipe): a job killed and restarted from checkpoints taken while slices were in flight ends with the weights of
the run never interrupted, and whole-job recovery (docs/recovery.md) brings back a cluster killed mid-stream."""
from __future__ import annotations

import numpy as np
import pytest
import yaml

from nebula.pipeline import read_metrics
from tests.federated.test_diloco_switch import _dp_job, _final_params, _run_both, _wait_lines
from testbed.federation import finish, launch, start_switches
from testbed.clusters import (EVERY, events, kill_cluster, metrics, recovery_job, redone,
                                     same_loss_each_time, wait_steps)

pytestmark = pytest.mark.slow  # two-cluster runs of 30-40 steps, a kill and a restart each (~1-2 min each here)

STREAM = {"sync_every": 4, "outer": {"algorithm": "diloco", "lr": 0.7, "momentum": 0.9, "codec": "int8"},
          "streaming": {"fragments": 2, "delay": 1}}


def test_killed_job_restarted_from_checkpoints_taken_mid_stream_ends_with_the_uninterrupted_weights(procs, tmp_path):
    """Slice 0 leaves after steps 2, 6, 10, ..., slice 1 after 4, 8, ..., each merged a step later; checkpoints every
    6 steps all hold a slice in flight (its outer step taken, its merge due). Cluster A has two ranks (they get the
    outer results from their leader). Both clusters killed and restarted: the same losses and final weights."""
    steps = 60
    kw = dict(procs=(2, 1), global_batch=16, micro_batches=1, recipe_args={"lr": 0.02}, data_parallel=STREAM)
    (tmp_path / "ref").mkdir()
    workers = start_switches(procs, tmp_path / "fed", ["A", "B"])
    _run_both(procs, _dp_job(tmp_path / "ref", workers, steps=steps, checkpoint={"dir": "ckpt"}, **kw))

    job = _dp_job(tmp_path, workers, steps=100000, checkpoint={"dir": "ckpt", "every": 6, "keep": 2},
                  peer_timeout_s=10, **kw)
    pa, pb = launch(procs, job, "A"), launch(procs, job, "B")
    for c in "AB":
        _wait_lines(tmp_path / "metrics" / f"{c}.rank0.jsonl", 14, (pa, pb))
    kill_cluster(pa, tmp_path / "metrics" / "log" / "A" / "ranks")
    kill_cluster(pb, tmp_path / "metrics" / "log" / "B" / "ranks")
    done = {c: len(read_metrics(tmp_path / "metrics" / f"{c}.rank0.jsonl")) for c in "AB"}
    assert min(done.values()) < steps - 6, done

    doc = yaml.safe_load(job.read_text())
    doc["train"]["steps"] = steps  # the reference's plan from here on (its last step sends every slice)
    job.write_text(yaml.safe_dump(doc, sort_keys=False))
    _run_both(procs, job)
    for c in "AB":
        recs = read_metrics(tmp_path / "metrics" / f"{c}.rank0.jsonl")[done[c]:]
        resumed = recs[0]["step"]
        assert resumed % 6 == 0 and 12 <= resumed <= min(done.values()), (c, resumed, done)
        assert [r["step"] for r in recs] == list(range(resumed, steps))
        ref = {r["step"]: r for r in read_metrics(tmp_path / "ref" / "metrics" / f"{c}.rank0.jsonl")}
        assert [r["fragments_merged"] for r in recs] == [ref[r["step"]]["fragments_merged"] for r in recs]
        for r in recs:
            assert r["loss"] == pytest.approx(ref[r["step"]]["loss"], rel=1e-6, abs=1e-7), (c, r["step"])
            # the same slices cross; only a header's mean number may differ in digits (it restarts with the run)
            assert abs(r["bytes_sent"] - ref[r["step"]]["bytes_sent"]) <= 8, (c, r["step"])
    want = _final_params(tmp_path / "ref", "A")
    for c in "AB":
        got = _final_params(tmp_path, c)
        assert got.keys() == want.keys()
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-7, err_msg=f"{c} {k}")


def test_a_cluster_killed_while_a_slice_is_in_flight_is_recovered_by_the_whole_job(procs, tmp_path):
    """Four slices, sync every 4, one step of delay: a slice leaves after every step and merges after the next, so
    one is always in flight (checkpoints every EVERY steps included). Cluster B (one rank) is killed mid-run and
    launched again; A (two ranks) recovers with it from the last common checkpoint, and every step redone has the
    loss it had the first time."""
    steps = 40
    workers = start_switches(procs, tmp_path / "fed", ["A", "B"])
    dp = {**STREAM, "streaming": {"fragments": 4, "delay": 1}}
    job = recovery_job(tmp_path, "data_parallel", workers, steps=steps, procs={"A": 2, "B": 1}, peer_timeout_s=6,
                       global_batch=16, micro_batches=1, recipe_args={"lr": 0.02}, data_parallel=dp)
    p = {c: launch(procs, job, c) for c in "AB"}
    wait_steps(tmp_path, "A", 2 * EVERY + 2, 300, list(p.values()))
    kill_cluster(p["B"], tmp_path / "metrics" / "log" / "B" / "ranks")
    p["B"] = launch(procs, job, "B")
    out = {c: finish(q, 400) for c, q in p.items()}
    assert all(code == 0 for code, _ in out.values()), "".join(o[-3000:] for _, o in out.values())
    rec = [e for e in events(tmp_path, "A") if e["event"] == "recovered"]
    assert len(rec) == 1 and rec[0]["step"] >= 2 * EVERY and rec[0]["step"] % EVERY == 0, events(tmp_path, "A")
    # at most one checkpoint interval redone, and the `delay` steps a survivor runs on before it waits for the lost
    # cluster's share of a slice in flight (as stale weights let a pipeline stage run ahead)
    assert 0 <= redone(tmp_path, "AB", rec[0]) <= EVERY + 1
    a, b = same_loss_each_time(metrics(tmp_path, "A")), same_loss_each_time(metrics(tmp_path, "B"))
    assert same_loss_each_time(metrics(tmp_path, "A", 1)) == a
    assert sorted(a) == sorted(b) == list(range(steps))
    sent = {r["step"]: r["fragments_sent"] for r in metrics(tmp_path, "A")}
    assert all(len(sent[s]) == 1 for s in range(steps - 1)) and sent[steps - 1] == [0, 1, 2, 3]
    pa_, pb_ = _final_params(tmp_path, "A"), _final_params(tmp_path, "B")
    for k in pa_:  # the last step sends every slice: both clusters end with the same model
        np.testing.assert_array_equal(pa_[k], pb_[k])
