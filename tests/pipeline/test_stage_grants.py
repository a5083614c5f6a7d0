"""A pipeline job through real switch servers and `nebula launch`, on a switch that enforces stage grants: the
job's workers declare the job file's stage map, so an account without a grant for its stage on that cluster is
refused before training, with the grant that fixes it; once granted (no switch restart), the job trains."""
from __future__ import annotations

import pytest

from nebula.pipeline import read_metrics
from security.accounts import Accounts
from security.cli import main as admin_main
from testbed.federation import finish, launch, start_switches
from tests.pipeline.helpers import TWO_STAGES, toy_job


@pytest.mark.slow
def test_launch_without_the_stage_grant_is_refused_naming_the_grant_and_runs_once_granted(procs, tmp_path, monkeypatch):
    monkeypatch.setenv("NEBULA_ACTOR", "ops-admin")
    home = tmp_path / "home"
    with Accounts(home, scrypt_n=1024) as acc:
        acc.add_user("admin", "admin-password", "admin", actor="root")
        acc.add_user("nebula", "nebula-password", actor="root")  # the workers' account: grants need it to exist
    # account nebula may run and address head (on B) only: not embed, which the job places on A
    assert admin_main(["--actor", "ops-admin", "grant", "add", "--home", str(home), "--to", "nebula",
                       "--resource", "stage:head"]) == 0
    workers = start_switches(procs, tmp_path / "fed", ["A", "B"],
                             edit=lambda c, doc: doc.update(accounts_home=str(home)) if c == "A" else None)
    job = toy_job(tmp_path, steps=2, stages=TWO_STAGES, peer_timeout_s=30,
                  clusters=[{"id": "A", "procs_per_node": 1, "worker": str(workers["A"])},
                            {"id": "B", "procs_per_node": 1, "worker": str(workers["B"])}])
    code, out = finish(launch(procs, job, "A"), 240)
    assert code != 0
    # one line from the worker, no traceback: the switch's reason and the command that fixes it
    assert ("nebula: the switch of cluster A refused job 'toy': not_authorized: account 'nebula' holds no grant for "
            "stage 'embed'; an admin can run `nebula-admin grant add --to nebula --resource stage:embed`") in out, \
        out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    audit = (tmp_path / "fed" / "A" / "audit.log").read_text()
    assert '"action":"route_refused"' in audit.replace(" ", "") and '"stages":["embed"]' in audit.replace(" ", "")
    assert admin_main(["--actor", "ops-admin", "grant", "add", "--home", str(home), "--to", "nebula",
                       "--resource", "stage:embed"]) == 0
    pa, pb = launch(procs, job, "A"), launch(procs, job, "B")
    (ca, outa), (cb, outb) = finish(pa, 240), finish(pb, 240)
    assert ca == 0 and cb == 0, outa[-3000:] + outb[-3000:]
    assert len(read_metrics(tmp_path / "metrics" / "B.rank0.jsonl")) == 2  # both steps trained
