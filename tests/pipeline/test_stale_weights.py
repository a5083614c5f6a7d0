"""train.stale_weights: N (PipeDream-2BW's delayed update): the upstream cluster sends step k+N's activations before
it takes step k's gradients, and what two clusters compute over links equals the stated update rule computed in one
process: w(k+1) = w(k) - adam(grad f(stash(k-N))) upstream, synchronous downstream, drained at checkpoints."""
from __future__ import annotations

import dataclasses
import queue
import struct
import threading

import pytest

from nebula.config.job import load_job_config
from nebula.pipeline.links import PeerLost, QueueLink
from tests.pipeline.helpers import TWO_STAGES, run_two_clusters, stale_reference, toy_job

STEPS, EVERY, MBS = 7, 3, 2
_STEP = struct.Struct("<q")  # a boundary message starts with its key's step


class _Gate:
    """Step k's gradients reach cluster A only once A has sent step k+lead's first activation, or a drain comes
    first."""

    def __init__(self, drains: set[int], lead: int = 1) -> None:
        self.sent_steps: set[int] = set()
        self.drains, self.lead = drains, lead
        self.cond = threading.Condition()

    def sent(self, step: int) -> None:
        with self.cond:
            self.sent_steps.add(step)
            self.cond.notify_all()

    def wait(self, step: int, timeout_s: float) -> bool:
        with self.cond:
            ahead = range(step + 1, step + self.lead + 1)
            return self.cond.wait_for(lambda: step + self.lead in self.sent_steps
                                      or any(s in self.drains for s in ahead), timeout_s)


class _ActLink(QueueLink):
    def __init__(self, out_q: queue.Queue, in_q: queue.Queue, gate: _Gate) -> None:
        super().__init__(out_q, in_q, peer_cluster="B")
        self.gate = gate

    def send(self, frames, lane: str):
        fut = super().send(frames, lane)
        self.gate.sent(_STEP.unpack_from(bytes(memoryview(frames[0]).cast("B")))[0])
        return fut


class _GradLink(QueueLink):
    def __init__(self, out_q: queue.Queue, in_q: queue.Queue, gate: _Gate) -> None:
        super().__init__(out_q, in_q, peer_cluster="B")
        self.gate = gate

    def recv(self, timeout_s: float) -> bytes:
        msg = super().recv(timeout_s)
        if not self.gate.wait(_STEP.unpack_from(msg)[0], timeout_s=20):
            raise TimeoutError("gradient held back: cluster A never sent the next step's activations")
        return msg


def _wiring(gate: _Gate) -> tuple[dict, dict, queue.Queue]:
    qs = {kind: (queue.Queue(), queue.Queue()) for kind in ("act", "grad", "ctl")}
    a = {"act": _ActLink(*qs["act"], gate), "grad": _GradLink(*qs["grad"], gate), "ctl": QueueLink(*qs["ctl"], "B")}
    b = {kind: QueueLink(qs[kind][1], qs[kind][0], "A") for kind in ("act", "grad", "ctl")}
    return {"next": a}, {"prev": b}, qs["ctl"][0]


def _two_clusters(cfg, tmp_path, gate: _Gate) -> dict[int, float]:
    wa, wb, a_to_b = _wiring(gate)
    # B builds its stages once A has (A's first control message says so)
    return run_two_clusters(cfg, wa, wb, tmp_path, a_ready=lambda: not a_to_b.empty(), timeout_s=120)[1].losses


@pytest.fixture
def cfg(tmp_path):
    job = toy_job(tmp_path, clusters=[{"id": "A"}, {"id": "B"}], stages=TWO_STAGES, steps=STEPS, micro_batches=MBS,
                  recipe_args={"depth": 1})
    c = load_job_config(job)
    return dataclasses.replace(c, train=dataclasses.replace(c.train, stale_weights=1), peer_timeout_s=30.0,
                               checkpoint=dataclasses.replace(c.checkpoint, dir=str(tmp_path / "ck"), every=EVERY))


@pytest.mark.parametrize("delay", [1, 2])
def test_two_clusters_overlap_steps_and_compute_the_delayed_update(cfg, tmp_path, delay):
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, stale_weights=delay))
    drains = {s for s in range(1, STEPS + 1) if s == STEPS or s % EVERY == 0}
    # completes only if A sends step k+delay before it takes step k's gradients
    got = _two_clusters(cfg, tmp_path / "run", _Gate(drains, lead=delay))
    ref = stale_reference(cfg, tmp_path / "ref")
    assert sorted(got) == list(range(STEPS))
    for k in range(STEPS):
        assert got[k] == pytest.approx(ref[k], rel=1e-5, abs=1e-6), (k, got, ref)
    sync = stale_reference(dataclasses.replace(cfg, checkpoint=dataclasses.replace(cfg.checkpoint, every=1)),
                      tmp_path / "sync")  # a drain every step is the synchronous schedule
    assert any(abs(got[k] - sync[k]) > 1e-4 for k in range(2, STEPS)), "stale and synchronous runs agree"


@pytest.mark.parametrize("delay", [0, 1])
def test_fewer_steps_in_flight_wait_for_the_gradients(cfg, tmp_path, delay):
    """The gate is real: with fewer steps in flight than it holds back, A waits for a gradient that never comes."""
    less = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, stale_weights=delay), peer_timeout_s=3.0,
                               checkpoint=dataclasses.replace(cfg.checkpoint, every=0))
    with pytest.raises((PeerLost, TimeoutError)):
        _two_clusters(less, tmp_path / "run", _Gate({STEPS}, lead=delay + 1))


@pytest.mark.parametrize("mode_extra, word", [({"mode": "oneway"}, "oneway"),
                                              ({"mode": "data_parallel"}, "data_parallel")])
def test_stale_weights_refused_outside_the_pipeline_mode(tmp_path, mode_extra, word):
    stages = [] if word == "data_parallel" else [{"name": "gen", "cluster": "A"}, {"name": "disc", "cluster": "B"}]
    job = toy_job(tmp_path, clusters=[{"id": "A"}, {"id": "B"}], stages=stages, **mode_extra)
    text = job.read_text().replace("seed: 3", "seed: 3\n  stale_weights: 1")
    job.write_text(text)
    with pytest.raises(Exception, match=rf"train.stale_weights=1 .* mode {word}: set train.stale_weights: 0"):
        load_job_config(job)


def test_stale_weights_value_checked(tmp_path):
    job = toy_job(tmp_path, clusters=[{"id": "A"}, {"id": "B"}], stages=TWO_STAGES)
    job.write_text(job.read_text().replace("seed: 3", "seed: 3\n  stale_weights: 5"))
    with pytest.raises(Exception, match=r"train.stale_weights=5 must be 0 .* from 1 to 4"):
        load_job_config(job)
