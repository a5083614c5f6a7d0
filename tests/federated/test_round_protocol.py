"""Real federated rounds: controller, combiners and clients as processes talking through TLS switch servers."""
from __future__ import annotations

import json

import numpy as np

from nebula.federated.trail import ModelTrail
from tests.federated.harness import federation, start_client, start_cluster, wait_exit, write_job


def test_rounds_through_switches_learn_reject_bad_updates_and_keep_the_trail(procs, tmp_path):
    workers = federation(procs, tmp_path)
    job = write_job(tmp_path, workers, {"A": 2, "B": 2}, rounds=3, validity={"min_updates": 2},
                    client={"factory": "tests.federated.toy_client:make_client",
                            "args": {"behaviours": {"B/1": "nan", "A/1": "shape"}}})
    ctl_a = start_cluster(procs, job, "A")
    comb_b = start_cluster(procs, job, "B")
    clients = [start_client(procs, job, c, i) for c in "AB" for i in range(2)]
    out = wait_exit(ctl_a, 120)
    wait_exit(comb_b, 30)
    for c in clients:
        wait_exit(c, 30)
    with ModelTrail(tmp_path / "fl" / "trail") as t:
        models = t.models()
        rounds = t.rounds()
        assert [m.version for m in models] == [1, 2, 3, 4], out
        assert [m.parent for m in models] == [None, 1, 2, 3]
        assert all(r.status == "valid" and r.num_updates == 2 for r in rounds)
        assert models[-1].clients == ["A/2", "B/2"]
        reasons = {r["client"]: r["reason"] for r in rounds[0].rejected}
        assert "NaN or Inf" in reasons["B/3"] and "has shape (5, 3), expected (4, 3)" in reasons["A/3"]
        # learning: the clients' evaluation of each round's global model improves
        assert models[-1].metrics["parent_accuracy"] > models[1].metrics["parent_accuracy"] + 0.2
        w, _ = t.load(4)
        assert np.isfinite(w["w"]).all()
    audit = [json.loads(line) for line in (tmp_path / "fl" / "combiner-B" / "audit.log").read_text().splitlines()]
    assert any(r["action"] == "fl.update" and r["outcome"] == "refused" and r["target"] == "B/3" for r in audit)
