"""Floods a combiner answers at once and counts: bogus "pushed" update headers whose pieces never come, and late
updates, through real switches; one audit record and one rejected entry for all of them."""
from __future__ import annotations

import json
import time

from nebula.channel import Endpoint
from nebula.federated.controller.trail import ModelTrail
from nebula.federated.messages import UpdateDropped
from nebula.federated.transport import ActorMessenger
from nebula.messaging import Peer
from testbed.fedjob import federation, start_client, start_cluster, wait_exit, write_job

FLOOD = 300
TENSORS = [["w", "float32", [4, 3]], ["b", "float32", [3]]]


def _drops(mb: ActorMessenger, combiner: Peer, n: int, timeout_s: float) -> int:
    """How many "drop" answers came from `combiner` (up to `n`) within `timeout_s`."""
    got, deadline = 0, time.monotonic() + timeout_s
    while got < n and time.monotonic() < deadline:
        m = mb.poll([combiner], deadline - time.monotonic())
        if m is not None and isinstance(m[1], UpdateDropped):
            got += 1
    return got


def test_bogus_pushed_headers_cost_no_waiting_and_late_updates_are_counted_not_written_one_by_one(procs, tmp_path):
    workers = federation(procs, tmp_path)
    # A/1 (rank 3) is the attacker: no hello, only update headers that say their pieces were pushed, for a round
    # that is not running, with no piece behind them
    job = write_job(tmp_path, workers, {"A": 2, "B": 0}, rounds=2, clients_per_round=1)
    actors = [start_cluster(procs, job, c) for c in "AB"]
    ep = Endpoint.connect(workers["A"], job="fltest", rank=3, timeout_s=30)
    try:
        mb = ActorMessenger(ep, 4096, Peer("A", 0))
        combiner = Peer("A", 1)
        bogus = {"type": "update", "job": "fltest", "round": 99, "version": 1, "num_examples": 10, "pushed": True,
                 "tensors": TENSORS, "piece_bytes": 4096}
        for _ in range(FLOOD):
            mb.send(combiner, bogus)
        # every header is answered (at once: waiting 5 s for each, as the combiner once did, takes 25 minutes)
        assert _drops(mb, combiner, FLOOD, 60) == FLOOD
        honest = start_client(procs, job, "A", 0)  # only now can round 1 start (one client per round)
        out = wait_exit(actors[0], 90)
        wait_exit(actors[1], 30)
        wait_exit(honest, 30)
    finally:
        ep.close(flush_s=1)
    with ModelTrail(tmp_path / "fl" / "trail") as t:
        rounds = t.rounds()
    assert [(r.status, r.num_updates) for r in rounds] == [("valid", 1), ("valid", 1)], out
    # one rejected entry for the whole flood, in the round that followed it
    (entry,) = rounds[0].rejected
    assert entry["count"] == FLOOD and entry["clients"] == ["A/3"] and entry["client"] == f"{FLOOD} from A/3"
    assert entry["reason"].startswith("late: no round in progress")
    assert rounds[1].rejected == []
    audit = [json.loads(line) for line in (tmp_path / "fl" / "combiner-A" / "audit.log").read_text().splitlines()]
    refused = [r for r in audit if r["action"] == "fl.update" and r["outcome"] == "refused"]
    assert len(refused) == 1 and refused[0]["detail"]["count"] == FLOOD and refused[0]["detail"]["kind"] == "late"
    assert refused[0]["target"] == f"{FLOOD} from A/3" and refused[0]["detail"]["clients"] == ["A/3"]
