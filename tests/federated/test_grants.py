"""Job grants: a combiner accepts only clients whose account holds a `job:NAME` grant in its cluster's account home."""
from __future__ import annotations

import json

from nebula.federated.controller.trail import ModelTrail
from security.routes import policy_from_rows
from testbed.fedjob import run_job
from testbed.fedruns import job_b_refuses


def test_job_grants_are_enforced_once_in_use():
    assert policy_from_rows([]).job_refusal("nebula", "langid") is None  # no job grant anywhere: not in use
    rows = [("nebula", "job", "langid", None, None), ("eve", "job", "other", None, None),
            ("old", "job", "langid", None, "2020-01-01T00:00:00Z")]
    p = policy_from_rows(rows)
    assert p.job_refusal("nebula", "langid") is None
    why = p.job_refusal("eve", "langid")
    assert "account 'eve' holds no grant for job 'langid'" in why and "--resource job:langid" in why
    assert p.job_refusal("old", "langid") is not None  # revoked
    assert policy_from_rows([("eve", "job", "*", None, None)]).job_refusal("eve", "langid") is None


def _audit(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_job_grants_hold_across_the_federation_refused_clients_train_through_no_combiner(procs, tmp_path):
    job, homes = job_b_refuses(procs, tmp_path, rounds=2)
    out = run_job(procs, job)
    with ModelTrail(tmp_path / "fl" / "trail") as t:
        rounds, models = t.rounds(), t.models()
    # B's home grants the account only another job: B's combiner took no client, and A's, which grants it, takes
    # A's client only: B's clients are refused by their own cluster, whichever combiner they reach
    assert [(r.status, r.num_updates) for r in rounds] == [("valid", 1), ("valid", 1)], out
    assert all(r.detail["assignment"] == {"A/1": ["A/2"]} for r in rounds)
    assert all(m.clients == ["A/2"] for m in models[1:])
    grant = [r for r in _audit(tmp_path / "fl" / "controller" / "audit.log") if r["action"] == "fl.grant"]
    assert sorted((r["target"], r["outcome"]) for r in grant) == [("A", "granted"), ("B", "refused")]
    assert "holds no grant for job 'fltest'" in next(r for r in grant if r["target"] == "B")["detail"]["reason"]
    # B's combiner refused both hellos: counted, one record for the two
    refused = [r for r in _audit(tmp_path / "fl" / "combiner-B" / "audit.log") if r["action"] == "fl.hello"]
    assert len(refused) == 1 and sorted(refused[0]["detail"]["clients"]) == ["A/2", "B/2"]
    assert refused[0]["detail"]["count"] == 2 and str(homes["B"]) in refused[0]["detail"]["reason"]
    audit_a = (tmp_path / "fl" / "combiner-A" / "audit.log").read_text()
    assert '"action":"fl.hello"' not in audit_a  # granted there: nothing refused
