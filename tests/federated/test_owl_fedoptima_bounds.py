"""The bounds OWL and FedOptima put on what a peer claims beyond the decoders' static ones (an update's examples, a
batch's rows: what the server knows of the job), and how their actors' refusals are counted into the audit log."""
from __future__ import annotations

import json

import numpy as np
import pytest

from nebula.federated._actor import ActorAudit, RefusalTally


def _owl_server(max_examples: int, stands_for: int, refused: list):  # noqa: ANN202
    """The OWL server's update checks as a server of one sender `B/2` (standing for `stands_for` workers) has
    them, without its channels."""
    from nebula.federated.owl.runtime import _OwlServer

    s = object.__new__(_OwlServer)  # (its checks use no channel: no endpoint needed)
    s.senders, s.stands_for, s.max_examples = {("B", 2)}, {("B", 2): stands_for}, max_examples
    s.refused = lambda *r, **kw: refused.append((*r, kw))
    return s


@pytest.mark.parametrize("num_updates, num_examples, ok", [(1, 64, True), (1, 65, False), (3, 192, True),
                                                          (3, 193, False), (3, 10**9, False)])
def test_owl_server_refuses_more_examples_than_local_steps_times_batch_per_update(num_updates, num_examples, ok,
                                                                                   caplog):
    from nebula.federated.owl.messages import OwlUpdate

    refused: list = []
    server = _owl_server(64, 3, refused)
    weights = {"w": np.ones(2, np.float32)}
    msg = OwlUpdate(round=0, num_examples=num_examples, num_updates=num_updates)
    assert server._update_ok(("B", 2), msg, dict(weights), 0, weights, {}) is ok
    if ok:
        assert refused == []
    else:
        most = 64 * num_updates
        assert refused == [("B/2", "num_examples", num_examples, f"1..{most} (local_steps x the task's batch for "
                            f"each of its {num_updates} updates)", {"message": "update"})]
        assert f"update from B/2 refused: num_examples={num_examples}, expected 1..{most}" in caplog.text


def test_fedoptima_server_refuses_a_batch_of_more_rows_than_the_tasks_batch():
    from nebula.federated.fedoptima.runtime import _Expect

    expect = _Expect((8,), "float32", 4, agg=None, max_rows=32)
    batch = {"h": np.zeros((32, 8), np.float32), "y": np.zeros(32, np.int64)}
    assert expect.activations_refusal(batch) is None
    batch = {"h": np.zeros((33, 8), np.float32), "y": np.zeros(33, np.int64)}
    assert expect.activations_refusal(batch) == "rows=33, expected 1..32 (the task's batch)"


def _audit(tmp_path) -> ActorAudit:  # noqa: ANN001
    """A real, signed actor audit log (as ActorAudit opens one) without a worker file."""
    from security.audit import AuditLog, generate_signing_key

    generate_signing_key(tmp_path / "k")
    a = object.__new__(ActorAudit)
    a.actor, a.log = "acct@B/2:owl-client", AuditLog(tmp_path / "audit.log", tmp_path / "k")
    return a


def test_an_actors_repeated_refusals_are_one_record_then_counted_and_logged_once_per_interval(tmp_path):
    from nebula.federated.actors import _refusals

    audit = _audit(tmp_path)
    tally = RefusalTally(by_sender=True, interval_s=3600)  # (no flush falls due during the test)
    refused = _refusals(audit, "fl.owl", tally)
    loud = [refused("B/4", "round", r, "0 (the round in progress)", message="update") for r in range(50, 60)]
    loud.append(refused("B/4", "round", 7, "0", message="group"))  # another message's field: its own count
    loud.append(refused("B/5", "round", 50, "0", message="update"))  # another peer: its own count
    assert loud == [True] + [False] * 9 + [True, True]  # a repeat's log line waits for the interval
    tally.flush(audit)  # (as the actor does at the end, before fl.stop)
    audit.close()
    records = [json.loads(x) for x in (tmp_path / "audit.log").read_text().splitlines()]
    refusals = [r["detail"] for r in records if r["action"] == "fl.owl"]
    # the first of each (peer, message, field) at once; B/4's nine repeats as one record with their count
    assert [(r["peer"], r["message"], r["value"], r["count"]) for r in refusals] == [
        ("B/4", "update", "50", 1), ("B/4", "group", "7", 1), ("B/5", "update", "50", 1), ("B/4", "update", "51", 9)]
    assert refusals[-1]["clients"] == ["B/4"] and refusals[-1]["kind"] == "update.round"


def test_counted_refusals_are_flushed_when_their_interval_has_passed(tmp_path):
    from nebula.federated.actors import _refusals

    audit = _audit(tmp_path)
    tally = RefusalTally(by_sender=True, interval_s=0)  # every refusal finds a flush due
    refused = _refusals(audit, "fl.fedoptima", tally)
    for _ in range(3):
        assert refused("B/4", "message", "hello: bad", "a well-formed message", message="hello") is True
    assert not tally  # nothing left waiting: each repeat was flushed when it came
    audit.close()
    counts = [json.loads(x)["detail"].get("count") for x in (tmp_path / "audit.log").read_text().splitlines()
              if json.loads(x)["action"] == "fl.fedoptima"]
    assert counts == [1, 1, 1]
