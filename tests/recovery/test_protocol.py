"""The recovery agreement as a pure state machine, over a simulated job: every order of arrival (channels deliver in
order per pair: all interleavings explored), messages in any order with copies (random schedules), a cluster lost
and launched again, dying again during the recovery, a cluster that lost its newest checkpoint, three clusters, the
bound on waiting, stale, late and copied messages, a launch whose disk lost its count, and a zombie launch."""
from __future__ import annotations

import random

import pytest

from nebula.recovery.messages import Decided, Holdings, Incarnation, Round
from nebula.recovery.protocol import (RESTART_HINT, Agreement, GiveUp, Paused, Received, RequestPause, Resume,
                                      Send, Started, Superseded, Tick)
from tests.recovery.sim import JOB, Sim, explore

ABC = ("A", "B", "C")
FULL = (10, 20, 30)


def _fresh(steps: dict[str, tuple[int, ...]], clusters=ABC) -> Sim:
    sim = Sim(clusters)
    for c in clusters:
        sim.launch(c, steps[c])
    return sim


def _agreed(want: int, clusters=ABC):
    def settle(sim: Sim) -> None:
        sim.check_safety()
        final = sim.final()
        assert set(final) == set(clusters), (final, sim.key())
        assert {s for s, _ in final.values()} == {want} and len({r for _, r in final.values()}) == 1, final
        assert not sim.other, sim.other
    return settle


def _running(steps=None) -> Sim:
    """Three clusters that agreed at launch and train (every message delivered)."""
    sim = _fresh(steps or {c: FULL for c in ABC})
    sim.run_random(random.Random(0), any_order=False, copies=0.0)
    assert {s for s, _ in sim.final().values()} == {30}
    sim.resumes.clear()
    return sim


# ---- launch: every order -------------------------------------------------------------------------------------
def test_three_clusters_launched_agree_on_the_newest_common_step_in_every_order():
    states = explore(_fresh({"A": (10, 20, 30), "B": (10, 20), "C": (20, 30)}), _agreed(20))
    assert states > 5_000  # (the interleavings of 12 messages over 6 ordered channels)


def test_no_common_checkpoint_means_every_cluster_starts_from_scratch():
    explore(_fresh({"A": (10,), "B": ()}, ("A", "B")), _agreed(-1, ("A", "B")))
    for seed in range(20):
        sim = _fresh({"A": (10,), "B": (20,), "C": ()})
        sim.run_random(random.Random(seed))
        _agreed(-1)(sim)


def test_one_cluster_alone_resumes_at_once():
    node = Agreement(JOB, ("A",), "A", Incarnation(1, 5), 60)
    assert node.handle(Started((3, 7)), 0.0) == [Resume(7, node.round)]


# ---- a cluster lost and launched again --------------------------------------------------------------------------
def _lost_and_relaunched(c_steps: tuple[int, ...]) -> Sim:
    sim = _running()
    sim.kill("C")
    sim.pause("A", lost=("C",))  # A's runtime found C silent; B learns of the recovery from A
    sim.launch("C", c_steps)
    return sim


def test_a_relaunched_cluster_and_the_survivors_agree_in_every_order():
    assert explore(_lost_and_relaunched(FULL), _agreed(30)) > 500


def test_a_relaunched_cluster_that_lost_its_newest_checkpoint_makes_everyone_resume_from_the_one_before():
    explore(_lost_and_relaunched((10, 20)), _agreed(20))


def test_both_survivors_finding_the_loss_themselves_make_one_round():
    sim = _running()
    sim.kill("C")
    sim.pause("A", lost=("C",))
    sim.pause("B", lost=("C",))
    sim.launch("C", FULL)
    explore(sim, _agreed(30))
    assert {r.epoch for _, _, _, r in sim.resumes} <= {1}


def test_survivors_pause_when_the_relaunched_cluster_speaks_before_they_noticed_the_loss():
    sim = _running()
    sim.kill("C")
    sim.launch("C", (10, 20))  # back within peer_timeout_s: nobody had paused yet
    explore(sim, _agreed(20))


@pytest.mark.parametrize("seed", range(40))
def test_a_cluster_that_dies_again_during_the_recovery_only_moves_everyone_to_the_next_round(seed):
    rng = random.Random(seed)
    sim = _lost_and_relaunched((10, 20))
    sim.run_random(rng, until=lambda s: rng.random() < 0.15)  # part of the recovery happens
    sim.kill("C")  # the second launch dies too; what it sent may still arrive
    sim.run_random(rng, until=lambda s: rng.random() < 0.3)
    sim.launch("C", (10,))  # the third launch has only step 10
    sim.run_random(rng)
    sim.check_safety()
    final = sim.final()
    assert set(final) == set(ABC) and {s for s, _ in final.values()} == {10}, final
    assert len({r for _, r in final.values()}) == 1
    assert final["A"][1].view[2] == sim.nodes["C"].incarnation  # the round of the last launch


@pytest.mark.parametrize("seed", range(60))
def test_messages_in_any_order_and_copied_change_nothing(seed):
    rng = random.Random(1000 + seed)
    sim = _lost_and_relaunched((10, 20))
    sim.run_random(rng, any_order=True, copies=0.3)
    sim.check_safety()
    final = sim.final()
    assert {s for s, _ in final.values()} == {20} and set(final) == set(ABC)
    assert len([r for r in sim.resumes if r[0] == "A"]) == 1  # copies did not make anyone resume twice


# ---- the bound on waiting -----------------------------------------------------------------------------------------
def test_survivors_give_up_with_todays_exit_message_when_the_lost_cluster_does_not_come_back():
    sim = _running()
    sim.kill("C")
    sim.pause("A", lost=("C",))
    sim.run_random(random.Random(1), any_order=False, copies=0.0)  # B pauses too
    assert sim.tick(59.0) == []
    out = sim.tick(1.5)
    assert {type(a) for a in out} == {GiveUp} and {a.cluster for a in out} == {"C"}
    assert all("peer cluster C did not come back within recovery_timeout_s=60 s" in a.message
               and "no holdings from C" in a.message and RESTART_HINT in a.message for a in out), out
    assert sim.tick(100.0) == []  # once given up, nothing more


def test_the_lost_cluster_coming_back_gives_the_agreement_its_full_time_again():
    sim = _running()
    sim.kill("C")
    sim.pause("A", lost=("C",))
    sim.run_random(random.Random(2), any_order=False, copies=0.0)
    sim.tick(50.0)
    sim.launch("C", FULL)
    sim.do(("deliver", ("C", "A")))  # C's holdings reach A and B: a new round, with the bound counted afresh
    sim.do(("deliver", ("C", "B")))
    sim.tick(30.0)  # 80 s after the loss, 30 s after C came back: still within the bound
    assert not sim.other
    explore(sim, _agreed(30))


def test_a_cluster_that_never_answers_at_launch_is_named_when_the_launch_gives_up():
    sim = Sim(ABC)
    sim.launch("A", FULL)
    sim.launch("B", FULL)
    sim.run_random(random.Random(3), any_order=False, copies=0.0)
    out = sim.tick(61.0)
    assert [a.cluster for a in out] == ["C", "C"] and "no holdings from C" in out[0].message


# ---- stale, late and zombie messages ----------------------------------------------------------------------------
def test_a_late_message_of_an_older_launch_is_ignored():
    sim = _running()
    node_a = sim.nodes["A"]
    old_c = sim.nodes["C"].incarnation
    sim.kill("C")
    sim.pause("A", lost=("C",))
    sim.launch("C", FULL)
    sim.run_random(random.Random(4), any_order=False, copies=0.0)
    before = (node_a.phase, node_a.round, dict(node_a.holdings), dict(node_a.decided))
    view = list(node_a.round.view)
    view[2] = old_c
    late = Holdings(JOB, "C", Round(node_a.round.epoch + 5, tuple(view)), (40,))
    assert node_a.handle(Received(late), sim.now) == []
    assert (node_a.phase, node_a.round, node_a.holdings, node_a.decided) == before


def test_a_message_of_an_older_round_is_ignored():
    sim = _running()
    a = sim.nodes["A"]
    old = Round(0, a.round.view)
    assert a.round.epoch == 0 or True
    sim.pause("A", lost=("C",))  # round 1 begins
    assert a.round.epoch == 1
    before = (a.round, dict(a.holdings))
    assert a.handle(Received(Holdings(JOB, "B", old, (30,))), 0.0) == []
    assert a.handle(Received(Decided(JOB, "B", old, 30)), 0.0) == []
    assert (a.round, a.holdings) == before


def test_an_older_launch_still_running_stops_when_it_learns_of_a_newer_one():
    sim = _running()
    zombie = sim.nodes["C"]
    sim.launch("C", FULL)  # launched again while the old process still runs (its host was only cut off)
    sim.nodes["C"] = zombie
    newer = Incarnation(zombie.incarnation.count + 1, 1)
    view = list(sim.nodes["A"].round.view)
    view[2] = newer
    out = zombie.handle(Received(Holdings(JOB, "A", Round(1, tuple(view)), FULL)), 0.0)
    assert len(out) == 1 and isinstance(out[0], Superseded) and "this older process stops" in out[0].message
    assert zombie.handle(Received(Holdings(JOB, "A", Round(2, tuple(view)), FULL)), 0.0) == []


def test_a_launch_whose_disk_lost_its_count_numbers_itself_above_the_one_seen():
    sim = _running()
    old = sim.nodes["C"].incarnation
    sim.kill("C")
    sim.pause("A", lost=("C",))
    sim.nonce = old.nonce - 100  # the same count as before, a smaller nonce: it compares older until renumbered
    sim.launch("C", FULL, count=old.count)
    sim.run_random(random.Random(5), any_order=False, copies=0.0)
    final = sim.final()
    assert {s for s, _ in final.values()} == {30} and set(final) == set(ABC)
    renumbered = [a for c, a in sim.other if c == "C"]
    assert [a.incarnation.count for a in renumbered] == [old.count + 1] and sim.disks["C"] == old.count + 1


def test_a_second_different_holdings_of_one_launch_in_one_round_is_ignored():
    a = Agreement(JOB, ("A", "B"), "A", Incarnation(1, 1), 60)
    a.handle(Started((10, 20)), 0.0)
    rnd = Round(0, (Incarnation(1, 1), Incarnation(1, 2)))
    a.handle(Received(Holdings(JOB, "B", rnd, (10, 20))), 0.0)
    assert a.handle(Received(Holdings(JOB, "B", rnd, (10,))), 0.0) == [] and a.holdings["B"] == (10, 20)
    assert a.handle(Received(Decided(JOB, "B", rnd, 20)), 0.0) == [Resume(20, rnd)]


def test_a_cluster_deciding_another_step_from_the_same_holdings_is_named():
    a = Agreement(JOB, ("A", "B"), "A", Incarnation(1, 1), 60)
    a.handle(Started((10, 20)), 0.0)
    rnd = Round(0, (Incarnation(1, 1), Incarnation(1, 2)))
    out = a.handle(Received(Holdings(JOB, "B", rnd, (10, 20))), 0.0)
    assert [type(x) for x in out] == [Send, Send, Send][:len(out)] and any(
        isinstance(x, Send) and isinstance(x.message, Decided) and x.message.step == 20 for x in out)
    out = a.handle(Received(Decided(JOB, "B", rnd, 10)), 0.0)
    assert len(out) == 1 and isinstance(out[0], GiveUp) and out[0].cluster == "B"
    assert "decided step 10" in out[0].message and "holdings give 20" in out[0].message


def test_a_running_cluster_asked_to_pause_sends_its_holdings_only_once_stopped():
    sim = _running()
    sim.pause("A", lost=("C",))
    b = sim.nodes["B"]
    out = b.handle(Received(sim.queues[("A", "B")].pop(0)), 0.0)
    assert [type(x) for x in out] == [RequestPause] and b.phase == "pausing"
    out = b.handle(Paused(FULL), 0.0)
    assert {x.to for x in out if isinstance(x, Send)} == {"A", "C"}


def test_events_out_of_place_are_refused():
    node = Agreement(JOB, ABC, "A", Incarnation(1, 1), 60)
    with pytest.raises(ValueError, match="Paused before Started"):
        node.handle(Paused(()), 0.0)
    node.handle(Started(()), 0.0)
    with pytest.raises(ValueError, match="a launch starts once"):
        node.handle(Started(()), 0.0)
    with pytest.raises(ValueError, match="one of the job's distinct clusters"):
        Agreement(JOB, ABC, "D", Incarnation(1, 1), 60)
    with pytest.raises(ValueError, match="recovery_timeout_s=0"):
        Agreement(JOB, ABC, "A", Incarnation(1, 1), 0)
    assert node.handle(Tick(), 1.0) == []
