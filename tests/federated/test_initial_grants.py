"""The initial model comes only from a client whose cluster holds the job's grant: a client of a cluster that refuses
the job (reachable through another cluster's combiner, as the updates of such a client are refused) is not asked,
and that refusal is audited with its reason."""
from __future__ import annotations

import json
from dataclasses import dataclass

from nebula.federated.trail import ModelTrail
from tests.federated.harness import run_job
from tests.federated.test_grants import job_b_refuses


@dataclass(frozen=True)
class InitialRun:
    """What a one-round job whose cluster B refuses the job left: models and rounds of the trail, the controller's
    audit records and output."""

    models: list
    rounds: list
    audit: list[dict]
    out: str


def initial_from_ungranted(procs, tmp_path) -> InitialRun:
    """A one-round job over real switches in which B's accounts home holds no grant for the job (A's does)."""
    # both clients would be asked (A's combiner accepts B's client too: A's home grants the account the job)
    job, _ = job_b_refuses(procs, tmp_path, rounds=1, initial_clients=2, initial_wait_s=5)
    out = run_job(procs, job)
    with ModelTrail(tmp_path / "fl" / "trail") as t:
        models, rounds = t.models(), t.rounds()
    audit = [json.loads(line) for line in (tmp_path / "fl" / "controller" / "audit.log").read_text().splitlines()]
    return InitialRun(models, rounds, audit, out)


def test_a_client_without_the_job_grant_does_not_supply_the_initial_model(procs, tmp_path):
    run = initial_from_ungranted(procs, tmp_path)
    models, audit, out = run.models, run.audit, run.out
    assert models[0].clients == ["A/2"], out
    initial = [(r["target"], r["outcome"]) for r in audit if r["action"] == "fl.initial"]
    assert ("B/2", "refused") in initial and ("A/2", "accepted") in initial and ("B/2", "accepted") not in initial
    why = next(r for r in audit if r["action"] == "fl.initial" and r["target"] == "B/2")["detail"]["reason"]
    assert why.startswith("not asked for the initial model: ") and "holds no grant for job 'fltest'" in why
    assert len(why.splitlines()) == 1
