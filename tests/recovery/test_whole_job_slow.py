"""Whole-job recovery in each launched mode, with `nebula launch` (paddle.distributed.launch process groups of two
ranks) and real switch servers: every rank of one cluster is killed (SIGKILL) mid-run and the cluster is launched
again, by the test or by its own `nebula launch --supervise`; the other cluster is left alone. The job finishes
with the losses of an uninterrupted run at every step (the steps redone included), and redoes at most one
checkpoint interval (plus oneway.sync_lag + 1 in the one-way mode, where a sender runs that far ahead, and the
steps in flight with stale weights). A switch host restart (its switch and its ranks killed, both started again)
is recovered from the same way."""
from __future__ import annotations

import pytest

from nebula.config.job import load_job_config
from nebula.modes import run
from testbed.federation import LocalFederation, finish, launch, start_switches
from tests.pipeline.helpers import stale_reference, toy_job
from testbed.clusters import (EVERY, events, kill_cluster, kill_ranks, metrics, recovery_job, redone,
                                     same_loss_each_time, start_rank, wait_steps)

pytestmark = pytest.mark.slow

STEPS = 40
TWO_STAGES_IN_A = [{"name": "embed", "cluster": "A"}, {"name": "head", "cluster": "A"}]


def _reference(tmp_path, **kw) -> dict[int, float]:
    """The uninterrupted run's losses: the same job in one process (world 1, every stage)."""
    (tmp_path / "ref").mkdir()
    return run(load_job_config(toy_job(tmp_path / "ref", clusters=[{"id": "A"}], **kw)), "A").losses


def _recovered_once(tmp_path, survivor: str, relaunched: str) -> dict:
    """The survivor recovered once, the relaunched cluster started as launch 2 in the same round; the event."""
    rec = [e for e in events(tmp_path, survivor) if e["event"] == "recovered"]
    assert len(rec) == 1, events(tmp_path, survivor)
    start = [e for e in events(tmp_path, relaunched) if e["event"] == "started"]
    assert [e["launch"] for e in start] == [1, 2] and start[-1]["tag"] == rec[0]["tag"], start
    assert start[-1]["step"] == rec[0]["step"] >= 2 * EVERY and rec[0]["step"] % EVERY == 0
    return rec[0]


def _kill_and_launch_again(procs, tmp_path, job, killed: str, survivor: str, in_flight: int = 0) -> dict:
    """Launch both clusters, SIGKILL every process of `killed` mid-run and launch it again; both finish; the
    survivor's recovered event (one recovery, at most one checkpoint interval redone, and the `in_flight` steps
    that stale weights let an upstream cluster end past a checkpoint the killed one had not made durable)."""
    p = {c: launch(procs, job, c) for c in sorted((killed, survivor))}
    wait_steps(tmp_path, survivor, 2 * EVERY + 2, 300, list(p.values()))
    kill_cluster(p[killed], tmp_path / "metrics" / "log" / killed / "ranks")
    p[killed] = launch(procs, job, killed)
    done = {c: finish(q, 400) for c, q in p.items()}
    assert all(code == 0 for code, _ in done.values()), "".join(out[-3000:] for _, out in done.values())
    recovered = _recovered_once(tmp_path, survivor, killed)
    assert 0 <= redone(tmp_path, "AB", recovered) <= EVERY + in_flight
    return recovered


def test_pipeline_two_ranks_per_cluster_the_upstream_cluster_killed_and_launched_again(procs, tmp_path):
    workers = start_switches(procs, tmp_path / "fed", ["A", "B"])
    job = recovery_job(tmp_path, "pipeline", workers, steps=STEPS, procs={"A": 2, "B": 2}, peer_timeout_s=6)
    _kill_and_launch_again(procs, tmp_path, job, killed="A", survivor="B")
    ref = _reference(tmp_path, steps=STEPS, stages=TWO_STAGES_IN_A)
    for rank in (0, 1):
        losses = same_loss_each_time(metrics(tmp_path, "B", rank))
        assert sorted(losses) == list(range(STEPS))
        for s in range(STEPS):
            assert losses[s] == pytest.approx(ref[s], rel=1e-5, abs=1e-6), (rank, s, losses[s], ref[s])


def test_oneway_the_receiver_cluster_killed_and_launched_again_by_its_supervisor(procs, tmp_path):
    workers = start_switches(procs, tmp_path / "fed", ["A", "B"])
    job = recovery_job(tmp_path, "oneway", workers, steps=STEPS, procs={"A": 1, "B": 2}, peer_timeout_s=6)
    pa, pb = launch(procs, job, "A"), launch(procs, job, "B", "--supervise")
    wait_steps(tmp_path, "B", 2 * EVERY + 2, 300, [pa, pb])
    kill_ranks(tmp_path / "metrics" / "log" / "B" / "ranks", 2)  # the supervisor sees its launch fail
    (ca, oa), (cb, ob) = finish(pa, 400), finish(pb, 400)
    assert ca == 0 and cb == 0, oa[-3000:] + ob[-3000:]
    assert "nebula launch: cluster B stopped (exit" in ob and "launching it again" in ob, ob[-3000:]
    recovered = _recovered_once(tmp_path, "A", "B")
    assert 0 <= redone(tmp_path, "AB", recovered) <= EVERY + 2  # a sender runs up to sync_lag + 1 steps ahead
    gen = same_loss_each_time(metrics(tmp_path, "A"))
    disc = same_loss_each_time(metrics(tmp_path, "B"))
    assert same_loss_each_time(metrics(tmp_path, "B", 1)) == disc
    assert sorted(gen) == sorted(disc) == list(range(STEPS))
    ref = _reference(tmp_path, steps=STEPS, recipe_args={"oneway": True},
                     stages=[{"name": "gen", "cluster": "A"}, {"name": "disc", "cluster": "A"}])
    for s in range(STEPS):  # (one process sums both losses)
        assert gen[s] + disc[s] == pytest.approx(ref[s], rel=1e-5, abs=1e-6), (s, gen[s], disc[s], ref[s])


def test_data_parallel_a_killed_cluster_launched_again(procs, tmp_path):
    workers = start_switches(procs, tmp_path / "fed", ["A", "B"])
    args = {"optimizer": "sgd", "lr": 0.5}
    job = recovery_job(tmp_path, "data_parallel", workers, steps=STEPS, procs={"A": 2, "B": 1}, peer_timeout_s=6,
                       global_batch=16, micro_batches=1, recipe_args=args)
    _kill_and_launch_again(procs, tmp_path, job, killed="B", survivor="A")
    a, b = same_loss_each_time(metrics(tmp_path, "A")), same_loss_each_time(metrics(tmp_path, "B"))
    assert same_loss_each_time(metrics(tmp_path, "A", 1)) == a
    assert sorted(a) == sorted(b) == list(range(STEPS))
    # sync every step, plain averaging, SGD: one process training on both clusters' data at once
    ref = _reference(tmp_path, steps=STEPS, global_batch=32, micro_batches=1, recipe_args=args,
                     stages=TWO_STAGES_IN_A)
    for s in range(STEPS):
        assert (a[s] + b[s]) / 2 == pytest.approx(ref[s], rel=1e-5, abs=1e-6), (s, a[s], b[s], ref[s])


def test_pipeline_a_switch_host_restart_its_switch_and_ranks_killed_and_started_again(procs, tmp_path):
    fed = LocalFederation(tmp_path / "fed", ["A", "B"], procs=procs)
    job = recovery_job(tmp_path, "pipeline", fed.workers, steps=STEPS, peer_timeout_s=4)
    a = start_rank(procs, job, "A", tmp_path / "A.log")
    b = start_rank(procs, job, "B", tmp_path / "B.log")
    wait_steps(tmp_path, "B", 2 * EVERY + 2, 120, [a, b])
    kill_cluster(b)  # the host goes down: its switch and its rank
    fed.switches["B"].kill9()
    fed.start("B")  # the host is back: its switch starts (same state directory), then the cluster
    b = start_rank(procs, job, "B", tmp_path / "B.log")
    assert a.wait(300) == 0, (tmp_path / "A.log").read_text()[-3000:]
    assert b.wait(120) == 0, (tmp_path / "B.log").read_text()[-3000:]
    recovered = _recovered_once(tmp_path, "A", "B")
    assert 0 <= redone(tmp_path, "AB", recovered) <= EVERY
    losses = same_loss_each_time(metrics(tmp_path, "B"))
    ref = _reference(tmp_path, steps=STEPS, stages=TWO_STAGES_IN_A)
    assert sorted(losses) == list(range(STEPS))
    for s in range(STEPS):
        assert losses[s] == pytest.approx(ref[s], rel=1e-5, abs=1e-6), (s, losses[s], ref[s])


def test_oneway_three_clusters_a_sender_cluster_killed_and_launched_again(procs, tmp_path):
    """M3: two sender clusters feed one receiver cluster; one sender dies, the receiver loses its feed, the other
    sender its sync tensors; both wait, all three resume from the newest common checkpoint."""
    workers = start_switches(procs, tmp_path / "fed", ["A", "B", "C"])
    job = recovery_job(tmp_path, "oneway3", workers, steps=STEPS, peer_timeout_s=6, procs={"C": 2})
    ranks = {c: start_rank(procs, job, c, tmp_path / f"{c}.log") for c in "AB"}
    pc = launch(procs, job, "C")  # one receiver rank per sender rank
    wait_steps(tmp_path, "C", 2 * EVERY + 2, 240, [*ranks.values(), pc])
    kill_cluster(ranks["B"])
    ranks["B"] = start_rank(procs, job, "B", tmp_path / "B.log")
    for c, p in ranks.items():
        assert p.wait(300) == 0, (tmp_path / f"{c}.log").read_text()[-3000:]
    code, out = finish(pc, 120)
    assert code == 0, out[-3000:]
    recovered = _recovered_once(tmp_path, "C", "B")
    assert [e["step"] for e in events(tmp_path, "A") if e["event"] == "recovered"] == [recovered["step"]]
    assert 0 <= redone(tmp_path, "ABC", recovered) <= EVERY + 2  # a sender runs up to sync_lag + 1 steps ahead
    losses = {c: same_loss_each_time(metrics(tmp_path, c)) for c in "ABC"}
    assert all(sorted(v) == list(range(STEPS)) for v in losses.values())
    ref = _reference(tmp_path, steps=STEPS, recipe_args={"oneway": True, "num_stages": 3}, mode="oneway",
                     oneway={"k": 1, "sync_lag": 1},
                     stages=[{"name": n, "cluster": "A"} for n in ("gen1", "gen2", "disc")])  # local hand-off
    ref_gen = {r["step"]: (r["loss/gen1"], r["loss/gen2"]) for r in metrics(tmp_path / "ref", "A")}
    for s in range(STEPS):
        got = (losses["A"][s], losses["B"][s], losses["C"][s])
        assert got == pytest.approx((*ref_gen[s], ref[s]), rel=1e-5, abs=1e-6), (s, got, ref_gen[s], ref[s])


def test_a_killed_cluster_not_launched_again_ends_the_others_with_exit_3_and_todays_message(procs, tmp_path):
    """The bound: cluster B is killed and nobody launches it again; A pauses, waits recovery_timeout_s, then exits
    3 with one line naming B, the bound and what to do (today's message)."""
    workers = start_switches(procs, tmp_path / "fed", ["A", "B"])
    job = recovery_job(tmp_path, "pipeline", workers, steps=STEPS, peer_timeout_s=3, recovery_timeout_s=6)
    a = start_rank(procs, job, "A", tmp_path / "A.log")
    b = start_rank(procs, job, "B", tmp_path / "B.log")
    wait_steps(tmp_path, "B", 2 * EVERY + 2, 120, [a, b])
    kill_cluster(b)
    assert a.wait(180) == 3, (tmp_path / "A.log").read_text()[-3000:]
    lines = [line for line in (tmp_path / "A.log").read_text().splitlines() if line.startswith("nebula: ")]
    assert len(lines) == 1, lines
    assert lines[0].startswith("nebula: peer cluster B lost: peer cluster B did not come back within "
                               "recovery_timeout_s=6 s"), lines[0]
    assert "Restart all clusters of the job: they resume from the last common checkpoint" in lines[0]
    assert not [e for e in events(tmp_path, "A") if e["event"] == "recovered"]  # it waited; nothing was agreed


def test_pipeline_with_stale_weights_the_downstream_cluster_killed_and_launched_again(procs, tmp_path):
    """train.stale_weights: 1: cluster A holds a step in flight when B dies; it drops it with the partial step,
    and the job finishes with the losses of the uninterrupted stale-weights run (checkpoints hold none in flight)."""
    workers = start_switches(procs, tmp_path / "fed", ["A", "B"])
    job = recovery_job(tmp_path, "pipeline", workers, steps=STEPS, peer_timeout_s=6)
    job.write_text(job.read_text().replace("seed: 3", "seed: 3\n  stale_weights: 1"))
    # (A drains at the checkpoint step and ends the next one with its backward in flight: if B dies before its
    # checkpoint is durable, that step is redone too)
    _kill_and_launch_again(procs, tmp_path, job, killed="B", survivor="A", in_flight=1)
    (tmp_path / "ref").mkdir()
    ref = stale_reference(load_job_config(job), tmp_path / "ref")
    losses = same_loss_each_time(metrics(tmp_path, "B"))
    assert sorted(losses) == list(range(STEPS))
    for s in range(STEPS):
        assert losses[s] == pytest.approx(ref[s], rel=1e-5, abs=1e-6), (s, losses[s], ref[s])
