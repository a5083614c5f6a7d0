"""Cross-cluster data parallelism through real switch servers: `nebula launch` per cluster (paddle.distributed.launch
process groups), TLS between the switches, the toy recipe."""
from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest
import yaml

from nebula.config.job import load_job_config
from nebula.pipeline import read_metrics
from nebula.modes import run
from testbed.federation import finish, launch, start_switches
from tests.pipeline.helpers import toy_job


def _dp_job(tmp_path, workers, *, procs=(1, 1), name="job.yaml", recipe_args=None, **extra):
    clusters = [{"id": c, "procs_per_node": n, "worker": str(workers[c])} for c, n in zip("AB", procs)]
    path = toy_job(tmp_path, clusters=clusters, stages=[], name=name, recipe_args=recipe_args, **extra)
    doc = yaml.safe_load(path.read_text())
    del doc["stages"]
    doc["mode"] = "data_parallel"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _losses(tmp_path, cluster):
    return {r["step"]: r for r in read_metrics(tmp_path / "metrics" / f"{cluster}.rank0.jsonl")}


def _run_both(procs, job, timeout_s=300):
    pa, pb = launch(procs, job, "A"), launch(procs, job, "B")
    (ca, oa), (cb, ob) = finish(pa, timeout_s), finish(pb, timeout_s)
    assert ca == 0 and cb == 0, oa[-3000:] + ob[-3000:]


@pytest.mark.slow
def test_average_every_step_equals_synchronous_data_parallel_over_all_clusters_data(procs, tmp_path):
    """Codec none, sync_every 1, SGD: two clusters (2 ranks and 1 rank) give the losses of one process training on
    both clusters' data at once."""
    workers = start_switches(procs, tmp_path / "fed", ["A", "B"])
    args = {"optimizer": "sgd", "lr": 0.5}
    job = _dp_job(tmp_path, workers, procs=(2, 1), steps=6, global_batch=16, micro_batches=1, recipe_args=args,
                  data_parallel={"sync_every": 1, "outer": {"algorithm": "average", "codec": "none"}})
    _run_both(procs, job)
    a, b = _losses(tmp_path, "A"), _losses(tmp_path, "B")
    (tmp_path / "ref").mkdir()
    ref_cfg = load_job_config(toy_job(tmp_path / "ref", steps=6, global_batch=32, micro_batches=1, recipe_args=args,
                                      clusters=[{"id": "A"}], stages=[{"name": "embed", "cluster": "A"},
                                                                      {"name": "head", "cluster": "A"}]))
    ref = run(ref_cfg, "A").losses
    for s in range(6):
        assert (a[s]["loss"] + b[s]["loss"]) / 2 == pytest.approx(ref[s], rel=1e-5, abs=1e-6), (s, a[s], b[s], ref)
        assert a[s]["synced"] and a[s]["bytes_sent"] > 0
    assert ref[5] < ref[0]  # it learns


def test_diloco_with_compressed_pseudo_gradients_learns_and_ends_with_one_model(procs, tmp_path):
    workers = start_switches(procs, tmp_path / "fed", ["A", "B"])
    job = _dp_job(tmp_path, workers, steps=24, global_batch=16, micro_batches=1, recipe_args={"lr": 0.02, "hidden": 64, "depth": 1},
                  checkpoint={"dir": "ckpt"},
                  data_parallel={"sync_every": 4, "outer": {"algorithm": "diloco", "lr": 0.7, "momentum": 0.9,
                                                            "codec": "ef(int8)"}})
    _run_both(procs, job)
    a, b = _losses(tmp_path, "A"), _losses(tmp_path, "B")
    first = np.mean([a[s]["loss"] + b[s]["loss"] for s in range(4)]) / 2
    last = np.mean([a[s]["loss"] + b[s]["loss"] for s in range(20, 24)]) / 2
    assert last < 0.8 * first, (first, last)
    synced = [s for s in range(24) if a[s]["synced"]]
    assert synced == [3, 7, 11, 15, 19, 23]
    raw = sum(v.size * 4 for v in _final_params(tmp_path, "A").values())
    assert a[3]["bytes_sent"] < raw / 2  # int8 pseudo-gradients: about a quarter of the float32 model
    pa_, pb_ = _final_params(tmp_path, "A"), _final_params(tmp_path, "B")
    for k in pa_:  # the last step syncs: both clusters hold the same model
        np.testing.assert_array_equal(pa_[k], pb_[k])


def _final_params(tmp_path, cluster):
    import paddle

    out = {}
    for f in sorted((tmp_path / "ckpt" / cluster).glob("step_*/*/model.pdparams")):
        out.update({f"{f.parent.name}.{k}": v.numpy() for k, v in paddle.load(str(f)).items()})
    assert out, list((tmp_path / "ckpt").rglob("*"))
    return out


@pytest.mark.slow
def test_killed_cluster_gives_a_clear_error_and_no_hang(procs, tmp_path):
    workers = start_switches(procs, tmp_path / "fed", ["A", "B"])
    # the survivor has two ranks: its leader reports the lost cluster and the launcher stops the other rank too
    job = _dp_job(tmp_path, workers, procs=(2, 1), steps=100000, peer_timeout_s=4, data_parallel={"sync_every": 2})
    pa, pb = launch(procs, job, "A"), launch(procs, job, "B")
    path = tmp_path / "metrics" / "B.rank0.jsonl"
    deadline = time.monotonic() + 180
    while not (path.exists() and len(path.read_text().splitlines()) >= 6):
        assert time.monotonic() < deadline and pa.poll() is None and pb.poll() is None
        time.sleep(0.2)
    os.killpg(pb.pid, signal.SIGKILL)  # cluster B dies: its launcher and every rank
    pb.wait(10)
    t0 = time.monotonic()
    code, out = finish(pa, 120)
    assert code != 0
    assert "nebula: peer cluster B lost: cluster B sent no tensors for mean" in out, out[-3000:]
    assert "restart every cluster of the job" in out
    assert time.monotonic() - t0 < 60


def test_clusters_whose_models_differ_are_refused_naming_the_tensor(procs, tmp_path):
    """Both clusters name the tensor, also the one whose model is still on its way when the other refuses it: B's
    32 MB model takes longer to send than A's small one takes to arrive, so B refuses A's model while its own is
    still leaving, and exits. A names the tensor only if B's start-up still delivers what it sent (before the
    runtime flushed on a failed start, A waited for the rest of B's model and then lost B)."""
    workers = start_switches(procs, tmp_path / "fed", ["A", "B"])
    limits = {"peer_timeout_s": 20, "startup_timeout_s": 90}  # a lost message fails the test, never hangs it
    job_a = _dp_job(tmp_path, workers, name="a.yaml", recipe_args={"hidden": 32, "depth": 1}, **limits)
    job_b = _dp_job(tmp_path, workers, name="b.yaml", recipe_args={"hidden": 2048, "depth": 1}, **limits)
    pa = launch(procs, job_a, "A")  # A first: its model is at B's switch when B's start-up reads it
    pb = launch(procs, job_b, "B")
    (ca, oa), (cb, ob) = finish(pa, 300), finish(pb, 300)
    assert ca != 0 and cb != 0
    for out in (oa, ob):
        assert "nebula: data_parallel: cluster " in out and "has shape" in out and "same job file" in out, out[-3000:]


def _wait_lines(path, n, procs_, timeout_s=180):
    deadline = time.monotonic() + timeout_s
    while not (path.exists() and len(path.read_text().splitlines()) >= n):
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs_), f"{path}: no {n} steps"
        time.sleep(0.1)


@pytest.mark.slow  # three two-cluster runs (~3 min on 2 busy cores); the state round trip is tested fast in test_diloco
def test_killed_job_resumes_its_replicas_and_outer_momentum_from_the_last_common_checkpoint(procs, tmp_path):
    """Both clusters killed mid-run, restarted: the losses go on as those of a run never interrupted (the outer
    Nesterov buffer and anchor come back from the checkpoint; without them the first sync after resuming differs)."""
    steps, dp = 60, {"sync_every": 4, "outer": {"algorithm": "diloco", "lr": 0.7, "momentum": 0.9}}
    kw = dict(global_batch=16, micro_batches=1, recipe_args={"lr": 0.02}, data_parallel=dp)
    (tmp_path / "ref").mkdir()
    workers = start_switches(procs, tmp_path / "fed", ["A", "B"])
    ref_job = _dp_job(tmp_path / "ref", workers, steps=steps, **kw)
    _run_both(procs, ref_job)
    ref = _losses(tmp_path / "ref", "A")

    # checkpoints every 6 steps: mid-round (last sync 4 steps back) and at syncs alike
    job = _dp_job(tmp_path, workers, steps=100000, checkpoint={"dir": "ckpt", "every": 6, "keep": 2},
                  peer_timeout_s=10, **kw)
    pa, pb = launch(procs, job, "A"), launch(procs, job, "B")
    for c in "AB":
        _wait_lines(tmp_path / "metrics" / f"{c}.rank0.jsonl", 14, (pa, pb))
    for p in (pa, pb):  # every cluster dies: its launcher and every rank
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(10)
    done = {c: len(read_metrics(tmp_path / "metrics" / f"{c}.rank0.jsonl")) for c in "AB"}
    assert min(done.values()) < steps - 6, done  # killed well before the reference's end

    doc = yaml.safe_load(job.read_text())
    doc["train"]["steps"] = steps  # the same plan as the reference from here on (its last step syncs)
    job.write_text(yaml.safe_dump(doc, sort_keys=False))
    _run_both(procs, job)
    for c in "AB":
        recs = read_metrics(tmp_path / "metrics" / f"{c}.rank0.jsonl")[done[c]:]
        resumed = recs[0]["step"]
        assert resumed % 6 == 0 and 12 <= resumed <= min(done.values()), (c, resumed, done)
        assert [r["step"] for r in recs] == list(range(resumed, steps))
        ref_c = _losses(tmp_path / "ref", c)
        syncs_after = [r["step"] for r in recs if r["synced"]]
        assert len(syncs_after) >= 2  # the resumed outer state is exercised
        for r in recs:
            assert r["loss"] == pytest.approx(ref_c[r["step"]]["loss"], rel=1e-5, abs=1e-6), (c, r["step"])
    assert ref[steps - 1]["loss"] < ref[0]["loss"]
