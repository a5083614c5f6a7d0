"""Job grants: a combiner accepts only clients whose account holds a `job:NAME` grant in its cluster's account home."""
from __future__ import annotations

import json

import yaml

from nebula.federated.trail import ModelTrail
from security.accounts import Accounts
from security.routes import policy_from_rows
from tests.federated.harness import federation, run_job, write_job


def _home(path, *resources: str):
    with Accounts(path, scrypt_n=1024) as acc:
        acc.add_user("nebula", "nebula-password", actor="root")  # the clients' account: grants need it to exist
        for r in resources:
            acc.add_route_grant("nebula", r, actor="admin")
    return path


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


def test_a_combiner_refuses_clients_without_a_job_grant_audited_and_the_rounds_go_on(procs, tmp_path):
    workers = federation(procs, tmp_path)
    homes = {"A": _home(tmp_path / "home-A", "job:fltest"), "B": _home(tmp_path / "home-B", "job:other")}
    job = write_job(tmp_path, workers, {"A": 1, "B": 1}, rounds=2, validity={"min_updates": 2})
    doc = yaml.safe_load(job.read_text())
    for c in doc["clusters"]:
        c["accounts_home"] = str(homes[c["id"]])
    job.write_text(yaml.safe_dump(doc))
    out = run_job(procs, job)
    with ModelTrail(tmp_path / "fl" / "trail") as t:
        rounds = t.rounds()
    # B's home grants the account only another job: B's combiner took no client; A's took both, and both trained
    assert [(r.status, r.num_updates) for r in rounds] == [("valid", 2), ("valid", 2)], out
    assert all(r.detail["assignment"] == {"A/1": ["A/2", "B/2"]} for r in rounds)
    audit = [json.loads(line) for line in (tmp_path / "fl" / "combiner-B" / "audit.log").read_text().splitlines()]
    refused = {r["target"]: r["detail"]["reason"] for r in audit if r["action"] == "fl.hello"}
    assert set(refused) == {"A/2", "B/2"}
    assert all("holds no grant for job 'fltest'" in why and str(homes["B"]) in why for why in refused.values())
    audit_a = (tmp_path / "fl" / "combiner-A" / "audit.log").read_text()
    assert '"action":"fl.hello"' not in audit_a  # granted there: nothing refused
