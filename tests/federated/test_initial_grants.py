"""The initial model comes only from a client whose cluster holds the job's grant: a client of a cluster that refuses
the job (reachable through another cluster's combiner, as the updates of such a client are refused) is not asked,
and that refusal is audited with its reason."""
from __future__ import annotations

from testbed.fedruns import initial_from_ungranted


def test_a_client_without_the_job_grant_does_not_supply_the_initial_model(procs, tmp_path):
    run = initial_from_ungranted(procs, tmp_path)
    models, audit, out = run.models, run.audit, run.out
    assert models[0].clients == ["A/2"], out
    initial = [(r["target"], r["outcome"]) for r in audit if r["action"] == "fl.initial"]
    assert ("B/2", "refused") in initial and ("A/2", "accepted") in initial and ("B/2", "accepted") not in initial
    why = next(r for r in audit if r["action"] == "fl.initial" and r["target"] == "B/2")["detail"]["reason"]
    assert why.startswith("not asked for the initial model: ") and "holds no grant for job 'fltest'" in why
    assert len(why.splitlines()) == 1
