"""The step-time model of the runner's GPipe schedule, and layer costs from every rank's own timings."""
from __future__ import annotations

import pytest

from nebula.hybrid.costs import LayerTiming, costs_from_timings
from nebula.hybrid.schedule import StageCost, allreduce_s, gpipe_bound_s, gpipe_step_s, link_s


@pytest.mark.parametrize("stages, micro", [(1, 1), (3, 4), (4, 8), (6, 2)])
def test_equal_stages_take_gpipes_fill_and_drain(stages, micro):
    st = [StageCost(1.0, 2.0)] * stages
    assert gpipe_step_s(st, micro) == pytest.approx((micro + stages - 1) * 3.0) == gpipe_bound_s(st, micro)


def test_unequal_stages_links_tails_and_sync_by_hand():
    st = [StageCost(1.0, 2.0, tail_s=0.5), StageCost(3.0, 6.0, tail_s=0.5)]
    # forwards end at 1, 2 on stage 0 and 4, 7 on stage 1; backwards: stage 1 at 13, 19, stage 0 at 15, 21
    assert gpipe_step_s(st, 2, sync_s=0.1) == pytest.approx(21.6)
    assert gpipe_step_s(st, 2) < gpipe_bound_s(st, 2)  # the closed form is an upper bound for unequal stages
    linked = [StageCost(1.0, 2.0, link_forward_s=0.25, link_backward_s=0.5), StageCost(3.0, 6.0)]
    # stage 1 starts 0.25 later; each gradient reaches stage 0 0.5 after stage 1 finishes it: 19.25 + 0.5 + 2
    assert gpipe_step_s(linked, 2) == pytest.approx(21.75)
    with pytest.raises(ValueError, match="at least one stage and one micro-batch"):
        gpipe_step_s([], 2)


def test_link_and_allreduce_terms():
    assert link_s(1000, 1e-3, 1e6, messages=2) == pytest.approx(3e-3)
    assert allreduce_s(1000, 1, 1e-3, 1e6) == 0.0
    assert allreduce_s(1000, 4, 1e-3, 1e6) == pytest.approx(6e-3 + 1.5e-3)


def test_each_rank_predicts_what_it_measured():
    def timing(f, b):
        return LayerTiming(f, b, 0.0, 400, 40, 40, 100)

    fast = [timing(1.0, 2.0), timing(2.0, 4.0)]
    slow = [timing(3.0, 6.0), timing(5.0, 10.0)]  # 3x and 2.5x: relative layer costs differ a little
    costs, tpf = costs_from_timings([fast, slow], batch=8, micro_batches=2)
    for rank, ts in zip(tpf, (fast, slow)):
        assert rank * sum(c.flops for c in costs) == pytest.approx(sum(t.forward_s + t.backward_s for t in ts))
    assert costs[1].flops > costs[0].flops
    assert costs[0].memory_bytes == 4 * 400 + 2 * 40 and costs[0].activation_bytes == 80


def test_shared_cores_replay_matches_the_recurrence_when_every_stage_has_a_core():
    import random

    from nebula.hybrid.schedule import _shared_step_s

    rnd = random.Random(5)
    for _ in range(40):
        s, m = rnd.randint(1, 5), rnd.randint(1, 6)
        st = [StageCost(rnd.uniform(0.1, 2), rnd.uniform(0.1, 3), rnd.uniform(0, 1), rnd.uniform(0, 0.2),
                        rnd.uniform(0, 0.2), rnd.choice([1.0, 0.5, 1 / 3])) for _ in range(s)]
        assert _shared_step_s(st, m, cores=s) == pytest.approx(gpipe_step_s(st, m))


def test_stages_sharing_one_core_by_hand():
    st = [StageCost(1.0, 1.0), StageCost(1.0, 1.0)]
    # F1 on stage 0 and F0 on stage 1 share the core (1..3), then F1 on stage 1 (3..4), B0 (4..5), both B's
    # share (5..7), the last B on stage 0 (7..8): the core is never idle, so 8 = all the work
    assert gpipe_step_s(st, 2, cores=1) == pytest.approx(8.0)
    assert gpipe_step_s(st, 2) == pytest.approx(6.0)
    # a slowed stage sleeps after computing and leaves the core: stage 1 computes 1/2 of each task, then sleeps
    slow = [StageCost(1.0, 1.0), StageCost(2.0, 2.0, cpu_share=0.5)]
    assert gpipe_step_s(slow, 1, cores=1) == pytest.approx(gpipe_step_s(slow, 1))  # nothing overlaps with M = 1
    assert gpipe_step_s(slow, 3, cores=1) > gpipe_step_s(slow, 3)
