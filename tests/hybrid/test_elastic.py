"""Re-allocation for the ranks that remain: reallocate's cut, checked by brute force over every cut."""
from __future__ import annotations

import itertools
import math

import pytest

from nebula.balance import DeviceProfile, LayerCost, allocate
from nebula.balance.cost import Problem
from nebula.hybrid import Layout
from nebula.hybrid.cut import stage_devices
from nebula.launch.elastic import reallocate_layout


def _held_bytes(bounds, new: Layout, old: Layout, old_bounds, layers) -> float:
    """Layer bytes that stay on their rank: each rank of a new stage keeps what its old stage had."""
    kept = 0.0
    for s in range(new.num_stages):
        for r in new.stage_ranks(s):
            p, q = old_bounds[old.stage_of(r)], old_bounds[old.stage_of(r) + 1]
            kept += sum(layers[j].memory_bytes for j in range(max(p, bounds[s]), min(q, bounds[s + 1])))
    return kept


@pytest.mark.parametrize("seed", range(6))
def test_two_by_two_losing_a_rank_gets_the_optimal_cut_that_moves_the_fewest_bytes(seed):
    import numpy as np

    rng = np.random.default_rng(seed)
    n = 9
    layers = [LayerCost(float(rng.integers(1, 5)) * 1e9, float(rng.integers(1, 9)) * 1e6, 1e3) for _ in range(n)]
    devices = [DeviceProfile(float(rng.choice([1, 2, 3])) * 1e-12, math.inf, name=f"rank{r}") for r in range(4)]
    old = Layout(2, 2)
    old_bounds = list(allocate(layers, stage_devices(devices, old), "optimal").bounds)
    plan = reallocate_layout(old, old_bounds, layers, devices, 3, "optimal")
    assert plan.layout == Layout(3, 1) and plan.seconds < 5.0
    now = stage_devices(devices[:3], plan.layout)
    best = allocate(layers, now, "optimal").bottleneck_s
    prob = Problem.of(layers)
    got_time = max(prob.stage_time_s(d, plan.bounds[k], plan.bounds[k + 1]) for k, d in enumerate(now))
    assert got_time == pytest.approx(best)
    total = sum(x.memory_bytes for x in layers)
    assert plan.total_bytes == total
    assert plan.moved_bytes == pytest.approx(total - _held_bytes(plan.bounds, plan.layout, old, old_bounds, layers))
    fewest = min(total - _held_bytes((0, *c, n), plan.layout, old, old_bounds, layers)
                 for c in itertools.combinations(range(1, n), 2)
                 if max(prob.stage_time_s(d, b, e) for d, b, e in zip(now, (0, *c), (*c, n))) <= best * (1 + 1e-12))
    assert plan.moved_bytes == pytest.approx(fewest)


def test_replicas_count_once_per_rank_that_lacks_a_layer():
    """2 x 3 -> 2 x 2 with an unbalanced old cut: the new optimum [0, 2, 4] moves layer 1 to both stage-0 ranks."""
    layers = [LayerCost(1e9, 10.0, 1.0) for _ in range(4)]
    devices = [DeviceProfile(1e-12, math.inf, name=f"rank{r}") for r in range(6)]
    plan = reallocate_layout(Layout(2, 3), [0, 1, 4], layers, devices, 4, "optimal")
    assert plan.layout == Layout(2, 2) and plan.bounds == [0, 2, 4]
    assert plan.moved_bytes == pytest.approx(2 * 10.0)  # ranks 0 and 2 each fetch layer 1; ranks 1 and 3 keep theirs
    assert plan.total_bytes == pytest.approx(2 * 40.0)
    assert {m.dst for m in plan.realloc.moves} == {"stage0"}


def test_a_departed_middle_rank_takes_its_own_profile_away():
    """2 x 2, rank 1 (the slow one) leaves: the survivors are ranks 0, 2, 3 (renumbered 0, 1, 2); the new layout's
    devices are theirs, so the cut is even (had the last rank been dropped instead, the slow one would have stayed
    and got fewer layers), and each survivor keeps what its own old stage held."""
    layers = [LayerCost(1e9, 10.0, 1.0) for _ in range(6)]
    devices = [DeviceProfile(t * 1e-12, math.inf, name=f"rank{r}") for r, t in enumerate((1, 5, 1, 1))]
    plan = reallocate_layout(Layout(2, 2), [0, 3, 6], layers, devices, 3, "optimal", survivors=[0, 2, 3])
    assert plan.layout == Layout(3, 1) and plan.bounds == [0, 2, 4, 6]
    # new rank 0 (old 0, stage 0) holds 0..3, new 1 (old 2, stage 0) holds 0..3, new 2 (old 3, stage 1) holds 3..6
    assert plan.moved_bytes == pytest.approx(10.0)  # only layer 3 moves, onto new rank 1
    wrong = reallocate_layout(Layout(2, 2), [0, 3, 6], layers, devices, 3, "optimal")  # the first three ranks
    assert wrong.bounds != plan.bounds
    with pytest.raises(ValueError, match="survivors"):
        reallocate_layout(Layout(2, 2), [0, 3, 6], layers, devices, 3, "optimal", survivors=[0, 2, 2])


def test_relayout_keeps_the_survivors_slowdowns(tmp_path):
    from nebula.config.job import load_job_config
    from nebula.launch.elastic import relayout
    from tests.hybrid.helpers import hybrid_job

    job = hybrid_job(tmp_path, ranks=4, pipeline={"num_stages": 2, "slowdown": [1.0, 5.0, 2.0, 3.0]})
    cfg = relayout(load_job_config(job), "A", 3, 6, survivors=[0, 2, 3])
    assert cfg.cluster("A").pipeline.slowdown == (1.0, 2.0, 3.0) and cfg.cluster("A").world_size == 3
    assert relayout(load_job_config(job), "A", 3, 6).cluster("A").pipeline.slowdown == (1.0, 5.0, 2.0)


def test_departure_watch_names_the_rank_that_went_first(tmp_path):
    """Three real processes record their pids as ranks do; rank 1 is killed, the others once the watch has seen it
    go (as the launcher stops a cluster's other ranks): the watch names rank 1 alone."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from nebula.launch.departures import RANK_DIR_ENV, DepartureWatch
    from testbed.federation import wait_until

    rank_dir = tmp_path / "ranks"
    code = "from nebula.launch.departures import record_rank; import time; record_rank(); time.sleep(60)"
    with DepartureWatch(rank_dir) as watch:
        procs = [subprocess.Popen([sys.executable, "-c", code], env=dict(
            os.environ, **{RANK_DIR_ENV: str(rank_dir), "PADDLE_TRAINER_ID": str(r)})) for r in range(3)]
        try:
            deadline = time.monotonic() + 60
            while len(list(rank_dir.glob("rank*.pid"))) < 3:
                assert time.monotonic() < deadline, "the ranks never recorded their pids"
                time.sleep(0.05)
            procs[1].send_signal(signal.SIGKILL)
            procs[1].wait()  # (reaped at once: gone from /proc)
            wait_until(lambda: watch.departed, 30, "the watch to see rank 1 go")
            for p in (procs[0], procs[2]):
                p.terminate()
            for p in procs:
                p.wait()
            time.sleep(0.2)  # an absence: a poll or two after the others went, the first finding still stands
        finally:
            for p in procs:
                p.kill()
    assert watch.departed == (1,)
