"""The leaders' error-feedback residuals (`outer.codec: ef(...)`, with `ef(lowrank(...))` its warm starts too)
carried through data-parallel checkpoints, through real switch servers (`nebula launch` per cluster, TLS between the
switches, the toy recipe): a job restarted from a checkpoint computes what the uninterrupted one does, a checkpoint
saved without codec state still resumes (the residuals from zero, said once in the log), and whole-job recovery
brings a cluster killed mid-run back to the losses it had."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from nebula.pipeline import checkpoint as ckpt
from nebula.pipeline import read_metrics
from nebula.recovery import durable
from testbed.clusters import metrics, recovery_job, same_loss_each_time
from testbed.federation import finish, launch, start_switches
from tests.federated.test_diloco_switch import _dp_job, _final_params
from tests.recovery.test_whole_job_slow import _kill_and_launch_again

EF = {"sync_every": 4, "outer": {"algorithm": "diloco", "lr": 0.7, "momentum": 0.9, "codec": "ef(int4_block)"}}
# Streaming DiLoCo: two slices, each sent every 4 steps (slice 0 after steps 2, 6, ..., slice 1 after 4, 8, ...),
# merged a step later; its leader keeps one ef codec per slice
STREAM = {**EF, "streaming": {"fragments": 2, "delay": 1}}
# low-rank pseudo-gradients inside ef: the checkpoint carries each tensor's warm start and generator too
LOWRANK = {**EF, "outer": {**EF["outer"], "codec": "ef(lowrank(rank=4))"}}
NOTE = "holds no outer codec state"


def _run_both(procs, job: Path) -> str:
    """Both clusters to the end; their output."""
    p = {c: launch(procs, job, c) for c in "AB"}
    out = {c: finish(q, 300) for c, q in p.items()}
    assert all(code == 0 for code, _ in out.values()), "".join(o[-3000:] for _, o in out.values())
    return "".join(o for _, o in out.values())


def _losses(tmp: Path, cluster: str, skip: int = 0) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(tmp / "metrics" / f"{cluster}.rank0.jsonl")[skip:]}


def _rewind(tmp: Path, to: int, steps: int) -> None:
    """Leave every cluster's checkpoints up to step `to` only (the job stopped right after saving it)."""
    for c in "AB":
        for s in range(to + 1, steps + 1):
            shutil.rmtree(ckpt.step_dir(tmp / "ckpt" / c, s), ignore_errors=True)


def _strip_codec_state(tmp: Path, step: int) -> None:
    """Make step `step` a checkpoint as saved before codec state was kept: its extra arrays without `codec*`,
    recommitted with their new digest."""
    for c in "AB":
        d = ckpt.step_dir(tmp / "ckpt" / c, step)
        arrays = {k: v for k, v in ckpt.load_extra(d, c).items() if not k.startswith("codec")}
        marker = ckpt.read_step_marker(tmp / "ckpt" / c, step, c)

        def write(p: Path) -> None:
            with open(p, "wb") as f:
                np.savez(f, **arrays)

        files = dict(marker.pop("files"))
        files[f"{c}.extra.npz"] = durable.write_atomic(d / f"{c}.extra.npz", write)
        ckpt.commit_step(tmp / "ckpt" / c, step, c, {k: v for k, v in marker.items() if k not in ("step", "cluster",
                                                                                               "time")}, files)


@pytest.mark.parametrize("dp", [pytest.param(EF, id="plain"), pytest.param(LOWRANK, id="lowrank"),
                                pytest.param(STREAM, marks=pytest.mark.slow, id="streaming")])
def test_a_job_restarted_with_ef_residuals_computes_what_the_uninterrupted_one_does(procs, tmp_path, dp):
    """Sync every 4 steps with ef(int4_block) pseudo-gradients, checkpoints every 6: the checkpoint of step 6 holds
    the residuals of the syncs before it (streaming: of the slices sent after steps 2, 4 and 6); restarted from it,
    both clusters have the losses (and end with the weights) of the run never stopped (ef(lowrank): the checkpoint
    holds each tensor's warm start as well, and they resume it). Plain DiLoCo: the same
    checkpoint stripped of its codec state still resumes, with the residuals from zero (said once by each leader),
    and then differs after its first sync."""
    steps = 16
    workers = start_switches(procs, tmp_path / "fed", ["A", "B"])
    job = _dp_job(tmp_path, workers, steps=steps, global_batch=16, micro_batches=1,
                  recipe_args={"lr": 0.02, "hidden": 64, "depth": 1}, data_parallel=dp,
                  checkpoint={"dir": "ckpt", "every": 6, "keep": 10})
    _run_both(procs, job)
    ref = {c: _losses(tmp_path, c) for c in "AB"}
    want = {c: _final_params(tmp_path, c) for c in "AB"}
    extra = ckpt.load_extra(ckpt.step_dir(tmp_path / "ckpt" / "A", 6), "A")
    assert str(extra["codec"]) == dp["outer"]["codec"] and any(k.startswith("codec/") for k in extra)
    assert any(".warm:" in k for k in extra) == (dp is LOWRANK)

    _rewind(tmp_path, 6, steps)
    out = _run_both(procs, job)
    assert NOTE not in out
    for c in "AB":
        got = _losses(tmp_path, c, skip=steps)
        assert sorted(got) == list(range(6, steps))
        assert got == {s: ref[c][s] for s in range(6, steps)}, c
        for k, v in want[c].items():
            np.testing.assert_array_equal(_final_params(tmp_path, c)[k], v, err_msg=f"{c} {k}")
    if dp is not EF:
        return

    _rewind(tmp_path, 6, steps)
    _strip_codec_state(tmp_path, 6)
    out = _run_both(procs, job)
    assert out.count(NOTE) == 2, out[-3000:]  # once by each cluster's leader
    for c in "AB":
        got = _losses(tmp_path, c, skip=2 * steps - 6)
        assert {s: got[s] for s in (6, 7)} == {s: ref[c][s] for s in (6, 7)}  # before the first sync
        assert got[8] != ref[c][8]  # the residuals restarted from zero at the sync after step 7


@pytest.mark.slow  # a two-cluster run of 40 steps, a kill and a relaunch (~30 s on 2 busy cores, more under load)
@pytest.mark.parametrize("dp", [{**EF, "sync_every": 2}, {**STREAM, "streaming": {"fragments": 4, "delay": 1}}],
                         ids=["plain", "streaming"])
def test_a_cluster_killed_mid_run_with_ef_residuals_is_recovered_to_the_losses_it_had(procs, tmp_path, dp):
    """ef(int4_block) pseudo-gradients, synced every 2 steps (streaming: four slices, one sent after every step and
    merged after the next, so one is always in flight): cluster B (one rank) is killed mid-run and launched again;
    A (two ranks) recovers with it from the last common checkpoint, residuals included, and every step redone has
    the loss it had the first time (with the residuals from zero the steps after the first sync would differ)."""
    steps = 40
    workers = start_switches(procs, tmp_path / "fed", ["A", "B"])
    job = recovery_job(tmp_path, "data_parallel", workers, steps=steps, procs={"A": 2, "B": 1}, peer_timeout_s=6,
                       global_batch=16, micro_batches=1, recipe_args={"lr": 0.02}, data_parallel=dp)
    # one recovery, at most one checkpoint interval redone (streaming: and the `delay` steps a survivor runs on
    # before it waits for the lost cluster's share of a slice in flight)
    rec = _kill_and_launch_again(procs, tmp_path, job, killed="B", survivor="A", in_flight=int("streaming" in dp))
    assert any(r["synced"] for r in metrics(tmp_path, "A") if r["step"] > rec["step"])  # residuals used again
    a, b = same_loss_each_time(metrics(tmp_path, "A")), same_loss_each_time(metrics(tmp_path, "B"))
    assert same_loss_each_time(metrics(tmp_path, "A", 1)) == a
    assert sorted(a) == sorted(b) == list(range(steps))
    pa_, pb_ = _final_params(tmp_path, "A"), _final_params(tmp_path, "B")
    for k in pa_:  # the last step syncs: both clusters end with the same model
        np.testing.assert_array_equal(pa_[k], pb_[k])
