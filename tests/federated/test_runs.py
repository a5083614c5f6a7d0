"""Every command names the run it belongs to: an earlier run's stop, to the combiners and to a client, reaches a
fresh run of the same job through real switches and stops nothing."""
from __future__ import annotations

import json

from nebula.channel import Endpoint
from nebula.federated.controller.trail import ModelTrail
from nebula.federated.transport import ActorMessenger
from nebula.messaging import Peer
from testbed.fedjob import federation, start_client, start_cluster, wait_exit, write_job


def _send_as(worker, rank: int, to: list[tuple[Peer, dict]]) -> None:
    """Connect as `rank` of the job, send each message and wait until it is acknowledged (delivered), close."""
    ep = Endpoint.connect(worker, job="fltest", rank=rank, timeout_s=30)
    try:
        mb = ActorMessenger(ep, 4096, Peer("A", 0))
        for peer, msg in to:
            mb.send(peer, msg)
        assert ep.flush(30), "the earlier run's message was not delivered"
    finally:
        ep.close(flush_s=1)


def test_an_earlier_runs_stop_stops_neither_the_combiners_nor_the_clients_of_a_fresh_run(procs, tmp_path):
    workers = federation(procs, tmp_path)
    job = write_job(tmp_path, workers, {"A": 1, "B": 1}, rounds=2, validity={"min_updates": 2})
    clients = [start_client(procs, job, c, 0) for c in "AB"]
    # what an earlier run's combiner B/1 sent its client as that run ended (to the client's process of then, and
    # to any process of its next incarnation), delivered now to the fresh run's client
    _send_as(workers["B"], 1, [(Peer("B", 2), {"type": "stop", "to": "0123456789abcdef"}),
                               (Peer("B", 2), {"type": "stop"})])
    combiners = [start_cluster(procs, job, c, role="combiner") for c in "AB"]
    # and what the earlier run's controller sent its combiners
    old = {"type": "stop", "run": "0.0badc0ffee00", "to": "fedcba9876543210"}
    _send_as(workers["A"], 0, [(Peer("A", 1), old), (Peer("B", 1), old), (Peer("A", 1), {"type": "stop"})])
    out = wait_exit(start_cluster(procs, job, "A", role="controller"), 90)
    for p in combiners:
        wait_exit(p, 30)
    trained = [wait_exit(p, 30) for p in clients]
    with ModelTrail(tmp_path / "fl" / "trail") as t:
        rounds = t.rounds()
    assert [(r.status, r.num_updates) for r in rounds] == [("valid", 2), ("valid", 2)], out
    assert all("trained 2 rounds" in o for o in trained), trained
    for c in "AB":
        audit = [json.loads(x) for x in (tmp_path / "fl" / f"combiner-{c}" / "audit.log").read_text().splitlines()]
        (refused,) = [r for r in audit if r["action"] == "fl.control"]
        assert refused["outcome"] == "refused" and "stop of another run" in refused["detail"]["reason"]
        assert refused["detail"]["count"] == (2 if c == "A" else 1)
