"""What an operator sees when a job cannot start: one line, printed once, naming the cluster or switch and the fix."""
from __future__ import annotations

import queue

import pytest

from nebula.pipeline.boundary import Boundary
from nebula.pipeline.links import PeerLost, PeerNeverCame, QueueLink
from testbed.federation import finish, launch, start_switches
from tests.pipeline.helpers import TWO_STAGES, toy_job


class _SwitchedLink(QueueLink):
    """An in-process link that reports our switch's link to the peer as a real channel does."""

    def __init__(self, up: bool) -> None:
        super().__init__(queue.Queue(), queue.Queue(), peer_cluster="B", peer_rank=1)
        self.up = up

    def peer_state(self) -> tuple[bool, str]:
        return self.up, ("the link of our switch at tcp://10.0.0.1:7101 to cluster 'B' is up" if self.up else
                         "our switch at tcp://10.0.0.1:7101: the link to cluster 'B' is down since Mon")


@pytest.mark.parametrize("up,fix", [(True, "its switch is up, so start cluster B's part of the job there"),
                                    (False, "start cluster B's switch (nebula-switch serve) and its part")])
def test_a_peer_that_never_came_is_named_with_our_switch_and_the_link_state(up, fix):
    links = {k: _SwitchedLink(up) for k in ("act", "grad", "ctl")}
    b = Boundary(side="downstream", codec=lambda d, s: "none", peer_timeout_s=60, **links)
    try:
        with pytest.raises(PeerNeverCame) as ei:
            b.recv_control((-1, 0, 0), timeout_s=0.3)  # the start-up wait
        msg = str(ei.value)
        assert ei.value.cluster == "B" and "\n" not in msg
        assert msg.startswith("cluster B never came: its rank 1 sent no control message within the start-up wait")
        assert "gave up after 0.3 s" in msg and "tcp://10.0.0.1:7101" in msg and fix in msg
        assert "peer_timeout_s" not in msg  # the wait was the start-up one, not the silence bound
    finally:
        b.close()


def test_a_peer_that_went_silent_is_lost_not_never_come():
    links = {k: _SwitchedLink(True) for k in ("act", "grad", "ctl")}
    b = Boundary(side="downstream", codec=lambda d, s: "none", peer_timeout_s=0.3, **links)
    try:
        with pytest.raises(PeerLost) as ei:
            b.recv_control((4, 0, 0))  # mid-run: the peer_timeout_s bound
        assert not isinstance(ei.value, PeerNeverCame) and "(peer_timeout_s=0.3)" in str(ei.value)
    finally:
        b.close()


def test_a_worker_started_before_its_switch_says_so_once_in_one_line(procs, tmp_path):
    from security.provision import provision

    provision("testfed", ["A", "B"], tmp_path / "fed")  # no switch started
    job = toy_job(tmp_path, clusters=[{"id": "A", "worker": str(tmp_path / "fed/A/worker.yaml")},
                                      {"id": "B", "worker": str(tmp_path / "fed/B/worker.yaml")}],
                  stages=TWO_STAGES, peer_timeout_s=3, startup_timeout_s=6)
    code, out = finish(launch(procs, job, "A"), 120)
    lines = [line for line in out.splitlines() if line.startswith("nebula: ")]
    assert code == 4 and len(lines) == 1, out[-3000:]
    assert lines[0].startswith("nebula: cluster A: switch at ") and "did not answer within 3" in lines[0]
    assert "Traceback" not in out


@pytest.mark.slow  # (end to end, ~20 s: the messages themselves are proven by the tests above)
def test_a_cluster_alone_names_the_cluster_that_never_came_once(procs, tmp_path):
    workers = start_switches(procs, tmp_path / "fed", ["A", "B"])  # B's switch runs, B's ranks do not
    clusters = [{"id": c, "worker": str(workers[c])} for c in ("A", "B")]
    job = toy_job(tmp_path, clusters=clusters, stages=TWO_STAGES, peer_timeout_s=60, startup_timeout_s=4)
    code, out = finish(launch(procs, job, "A"), 120)
    lines = [line for line in out.splitlines() if line.startswith("nebula: ")]
    assert code == 3 and len(lines) == 1, out[-3000:]
    assert lines[0].startswith("nebula: cluster B never came: its rank 0 sent no control message") and \
        "gave up after 4 s" in lines[0] and "to cluster 'B' is up" in lines[0], lines[0]
    assert "--cluster B" in lines[0] and "peer_timeout_s=60" not in lines[0] and "Traceback" not in out
