"""OWL end to end: a server in cluster A, workers in cluster B as real processes through real TLS switch servers;
each group crosses the WAN once, workers pass the rest to each other inside B, and the model learns."""
from __future__ import annotations

import json

from testbed.federation import start_switches

PROC = ["-m", "tests.federated.owl_proc"]


def _result(p, timeout_s: float) -> dict:
    out, _ = p.communicate(timeout=timeout_s)
    assert p.returncode == 0, out
    return json.loads(out.split("RESULT ", 1)[1].splitlines()[0])


def test_owl_distributes_through_peers_and_learns(procs, tmp_path):
    workers = start_switches(procs, tmp_path / "fed", ["A", "B"])
    spec = json.dumps(dict(rounds=4, local_steps=5, lr=0.1, num_groups=2, round_timeout_s=60, peer_timeout_s=20))
    server = procs.python(*PROC, "--role", "server", "--worker", str(workers["A"]), "--rank", "0",
                          "--workers", "B/1,B/2,B/3", "--spec", spec)
    ws = [procs.python(*PROC, "--role", "worker", "--worker", str(workers["B"]), "--rank", str(r),
                       "--server", "A/0", "--spec", spec) for r in (1, 2, 3)]
    res = _result(server, 120)
    stats = [_result(w, 60) for w in ws]
    model_bytes = sum(res["group_bytes"])
    assert res["num_groups"] == 2 and res["pulls_served"] == 0
    # the combiner (B/1) averaged all three updates inside B: one update per round crossed the WAN
    assert res["updates"] == [3, 3, 3, 3] and res["wan_updates"] == [1, 1, 1, 1]
    # each group left the server once per round (plus message headers), not once per worker
    for egress in res["server_egress_bytes"]:
        assert model_bytes <= egress < model_bytes + 4096
    # the workers moved the rest: worker 0 and 1 are central workers and forward their group to the others
    assert sum(s["forwarded_bytes"] for s in stats) >= 4 * (model_bytes * 3 - model_bytes)
    assert all(s["rounds"] == 4 and s["pulled"] == 0 for s in stats)
    # learning on held-out data against the same model untrained (four classes: chance 0.25)
    assert res["accuracy"] >= 0.85 and res["accuracy"] >= res["initial_accuracy"] + 0.3, res
