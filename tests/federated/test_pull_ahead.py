"""A combiner pulls the next updates of a round while one is still arriving (`combiner.rounds.PULL_AHEAD` of them
beyond it, no more): their transfers overlap its checks and folding. Real controller and combiner processes
through real switches; the clients are driven message by message here, so that the first one holds its pieces
back until the pulls it must not block have come."""
from __future__ import annotations

import os
import threading
import time

import numpy as np

from nebula.channel import Endpoint
from nebula.federated.actor_channels import COMBINER_RANK, CONTROLLER_RANK, FIRST_CLIENT_RANK
from nebula.federated.combiner.rounds import PULL_AHEAD
from nebula.federated.config import load_federated_job
from nebula.federated.messages import ClientHello, ClientUpdate, PullUpdate, TrainTask
from nebula.federated.controller.trail import ModelTrail
from nebula.federated.transport import ActorMessenger
from nebula.messaging import PUSH_BYTES, Peer
from testbed.fedjob import federation, start_cluster, wait_exit, write_job

SIZE = PUSH_BYTES // 4 + 1000  # float32 values: each update is pulled, not pushed with its header


class _Client:
    """One client rank of cluster B, driven step by step."""

    def __init__(self, job, index: int) -> None:
        self.job, self.me = job, f"B/{FIRST_CLIENT_RANK + index}"
        ep = Endpoint.connect(job.cluster("B").worker, job=job.job, rank=FIRST_CLIENT_RANK + index, timeout_s=30)
        self.mb = ActorMessenger(ep, job.piece_bytes, Peer("A", CONTROLLER_RANK))
        self.comb = Peer("B", COMBINER_RANK)
        self.nonce = os.urandom(8).hex()
        self.update = {"w": np.full(SIZE, float(index + 1), np.float32)}
        self.mb.send(self.comb, ClientHello(job=job.job, num_examples=10, nonce=self.nonce))
        self.pulled = threading.Event()

    def _next(self, kind: type, timeout_s: float):
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            got = self.mb.poll([self.comb], max(0.0, end - time.monotonic()))
            if got is not None and isinstance(got[1], kind):
                return got
        raise AssertionError(f"{self.me}: no {kind.__name__} within {timeout_s} s")

    def announce(self) -> None:
        """Take the round's task and model; announce an update (its pieces wait to be pulled)."""
        _, task, parts = self._next(TrainTask, 60)
        self.mb.recv_model(self.comb, task, 30, inline=parts)
        head = ClientUpdate(job=self.job.job, round=task.round, version=task.version, num_examples=10, metrics={})
        self.mb.send(self.comb, self.mb.model_header(head, self.update))

    def wait_pull(self, timeout_s: float = 30) -> None:
        self._next(PullUpdate, timeout_s)
        self.pulled.set()

    def send(self) -> None:
        self.mb.send_pieces(self.comb, self.update)
        self.mb.ep.flush(30)


def test_the_combiner_pulls_the_next_updates_while_one_is_still_arriving(procs, tmp_path):
    workers = federation(procs, tmp_path)
    np.savez(tmp_path / "initial.npz", w=np.zeros(SIZE, np.float32))
    n = PULL_AHEAD + 2  # the first, those pulled ahead of it, and one that must wait for it
    path = write_job(tmp_path, workers, {"B": n}, rounds=1, deadline_s=60, validity={"min_updates": n},
                     initial_model=str(tmp_path / "initial.npz"))
    job = load_federated_job(path)
    ctl, comb = start_cluster(procs, path, "A"), start_cluster(procs, path, "B")
    clients = [_Client(job, i) for i in range(n)]
    try:
        first, ahead, last = clients[0], clients[1:-1], clients[-1]
        first.announce()
        first.wait_pull()
        for c in ahead:  # announced while the first update's pieces are held back: pulled all the same
            c.announce()
            c.wait_pull()
        last.announce()
        # beyond PULL_AHEAD the combiner takes the first update before it looks at another header
        assert not last.pulled.wait(2.0) and not _pulled_now(last)
        first.send()
        last.wait_pull()
        for c in clients[1:]:
            c.send()
        wait_exit(ctl, 90)
        wait_exit(comb, 30)
    finally:
        for c in clients:
            c.mb.ep.close(flush_s=1)
    with ModelTrail(tmp_path / "fl" / "trail") as t:
        rounds = t.rounds()
        assert [r.status for r in rounds] == ["valid"] and rounds[0].num_updates == n
        w, _ = t.load(2)
    # FedAvg of equal weights: the mean of 1, 2, ..., n
    np.testing.assert_allclose(w["w"], np.full(SIZE, (n + 1) / 2, np.float32), rtol=1e-6)


def _pulled_now(c: _Client) -> bool:
    """Whether a pull for `c` is already waiting (taken if so)."""
    got = c.mb.poll([c.comb], 0.0)
    return got is not None and isinstance(got[1], PullUpdate)
