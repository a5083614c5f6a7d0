"""Per-account shares of a peer link: accounts take turns by bytes inside a lane, and an account whose frames the
peer cannot take (its ranks there are not connected) is held back at its own switch while the others' frames go."""
from __future__ import annotations

import json
import time
from pathlib import Path

from nebula.channel import Endpoint
from nebula.wire import Lane
from switch_server.fairlanes import QUANTUM_BYTES, FairLanes
from testbed.federation import edit_yaml, start_switch, wait_audit
from tests.switch.conftest import worker_yaml
from testbed.attackers import add_worker

MIB = 1024**2


def _items(lanes: FairLanes, n: int) -> list[str]:
    out = []
    for _ in range(n):
        got = lanes.pop()
        if got is None:
            break
        out.append(got[1][0])
    return out


def test_accounts_take_turns_by_bytes_within_a_lane():
    """100 frames of 256 KiB from one account, then 8 of 4 KiB from another, on the same lane: the second account's
    frames all leave within the first 8 turns of the first's (FIFO would have them wait behind all 100)."""
    lanes = FairLanes()
    flood, other = ("account", "flood"), ("account", "ops")
    for i in range(100):
        lanes.push(Lane.ACTIVATION, (f"f{i}", b"", flood), 256 * 1024)
    for i in range(8):
        lanes.push(Lane.ACTIVATION, (f"o{i}", b"", other), 4096)
    order = _items(lanes, 108)
    assert len(order) == 108 and lanes.bytes == 0
    last_ops = max(i for i, name in enumerate(order) if name.startswith("o"))
    assert last_ops < 16, order[:20]
    # by bytes: while both wait, each gets about a quantum per turn
    assert order.index("o7") > order.index("o0")


def test_a_held_account_waits_and_the_lane_priority_still_holds():
    lanes = FairLanes()
    a, b = ("account", "a"), ("account", "b")
    lanes.push(Lane.BULK, ("a-bulk", b"", a), QUANTUM_BYTES)
    lanes.push(Lane.ACTIVATION, ("a-act", b"", a), 100)
    lanes.push(Lane.ACTIVATION, ("b-act", b"", b), 100)
    lanes.hold(a, 60.0)
    assert _items(lanes, 3) == ["b-act"]  # a's frames wait, whatever their lane
    assert not lanes  # nothing may go now
    assert lanes.next_release() is not None and lanes.holding() == [a]
    lanes.held[a] = 0.0  # (the hold ends)
    assert _items(lanes, 3) == ["a-act", "a-bulk"]


def test_an_account_flooding_a_peers_unconnected_ranks_is_held_back_while_others_go(procs, federation):
    """Account nebula on A sends 30 MiB to a rank of B that never connects: B holds 2 MiB of it, drops the rest
    (audited) and asks A to hold nebula's frames back; A does so (its status names the account held and what it
    keeps queued for it) while account ops's 20 messages, on the same lane, reach B."""
    yb = Path(federation["clusters"]["B"]["switch_yaml"])
    edit_yaml(yb, lambda d: d.setdefault("limits", {}).update(pending_bytes=2 * MIB))
    ops_a, ops_b = add_worker(federation, "A", "opsw", "ops"), add_worker(federation, "B", "opsw", "ops")
    a = start_switch(procs, Path(federation["clusters"]["A"]["switch_yaml"]))
    b = start_switch(procs, yb)
    status = Path(federation["clusters"]["A"]["switch_yaml"]).parent / "state" / "status.json"
    with Endpoint.connect(worker_yaml(federation, "A"), job="j", rank=0) as flooder, \
            Endpoint.connect(ops_a, job="legit", rank=0) as oa, Endpoint.connect(ops_b, job="legit", rank=0) as ob:
        flood = flooder.channel("B", 3, "flood")
        for _ in range(30):
            flood.send(bytes(MIB))  # (activation lane, as ops's)
        deadline = time.monotonic() + 60
        link = {}
        while time.monotonic() < deadline:
            try:
                link = json.loads(status.read_text())["links"]["B"]
            except (OSError, ValueError, KeyError):
                link = {}
            if "nebula" in link.get("held_accounts", ()):
                break
            time.sleep(0.2)
        assert "nebula" in link.get("held_accounts", ()), link
        assert link["queued_by_account"].get("nebula", 0) > 0
        tx, rx = oa.channel("B", 0, "legit"), ob.channel("A", 0, "legit")
        for i in range(20):
            tx.send(i.to_bytes(4, "big") * 1000)
        assert [int.from_bytes(rx.recv(timeout_s=60)[:4], "big") for _ in range(20)] == list(range(20))
        flooder.close(flush_s=0)
    rec = wait_audit(b, lambda r: r["action"] == "frame_dropped" and r["detail"]["reason"] == "pending_over_budget")
    assert rec["target"] == "nebula"
    assert not any(r["action"] == "control_ignored" and r["detail"].get("reason") == "hold_ignored" for r in b.audit())
