"""Stage grants enforced by real switch servers: a worker declares its job's stage map in its HELLO; switch A
refuses (and audits) a worker whose account may not run the job's stages on A or address the stages on the
destination cluster, and one that declares another map than its job's other workers; `stage:*` reaches every
stage; grants apply live; a granted transfer running meanwhile arrives whole and in order."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from nebula.channel import ChannelError, Endpoint, SwitchRefused
from security.accounts import Accounts
from testbed.federation import edit_yaml, start_switch, wait_audit
from tests.switch.conftest import legit_transfer
from testbed.attackers import add_worker
from tests.switch.test_route_grants import grant, refused

JOB = {"enc": "A", "dec": "B"}  # the job file's stages: enc runs on A, dec on B
MESSAGES = 24


@pytest.fixture
def staged(procs, federation, tmp_path, capsys, monkeypatch):
    """A's switch enforcing an account home in which nebula holds stage:enc and stage:dec and ops holds only
    stage:enc; an ops worker on A and on B. Returns (fed, A, home, ops worker.yaml on A, on B)."""
    monkeypatch.setenv("NEBULA_ACTOR", "ops-admin")
    home = tmp_path / "home"
    with Accounts(home, scrypt_n=1024) as acc:
        acc.add_user("admin", "admin-password", "admin", actor="root")
        for account in ("nebula", "ops"):  # the workers' accounts: grants are only for accounts that exist
            acc.add_user(account, f"{account}-password", actor="root")
    for account, stage in (("nebula", "enc"), ("nebula", "dec"), ("ops", "enc")):
        grant(capsys, home, "add", "--to", account, "--resource", f"stage:{stage}")
    ops_a, ops_b = add_worker(federation, "A", "opsw", "ops"), add_worker(federation, "B", "opsw", "ops")
    a_yaml = Path(federation["clusters"]["A"]["switch_yaml"])
    edit_yaml(a_yaml, lambda d: d.update(accounts_home=os.path.relpath(home, a_yaml.parent)))
    a = start_switch(procs, a_yaml)
    start_switch(procs, Path(federation["clusters"]["B"]["switch_yaml"]))
    return federation, a, home, ops_a, ops_b


def test_stage_grants_refuse_audit_and_apply_live_while_a_granted_transfer_completes(staged, capsys):
    fed, a, home, ops_a, ops_b = staged
    legit, done = legit_transfer(fed, MESSAGES, job="legit", stages=JOB, src="A", dst="B")  # nebula: granted
    # ops may run enc on A but not address dec on B: its frames to B are refused with the fix, audited
    with Endpoint.connect(ops_a, job="j", rank=0, stages=JOB) as oa:
        why = refused(oa, "B")
        assert "not_authorized" in why and "account 'ops' holds no grant for stage 'dec'" in why
        assert "nebula-admin grant add --to ops --resource stage:dec" in why
        rec = wait_audit(a, lambda r: r["action"] == "route_refused" and r["detail"].get("stages") == ["enc", "dec"])
        assert rec["outcome"] == "denied" and rec["detail"]["account"] == "ops" and rec["detail"]["cluster"] == "B"
        # a job whose file places no stage on A or B addresses no stage: only cluster grants (none here) apply
        with Endpoint.connect(ops_a, job="other", rank=0, stages={"head": "C"}) as plain, \
                Endpoint.connect(ops_b, job="other", rank=0) as plain_b:
            plain.channel("B", 0, "x").send(b"no stage of ours on B")
            assert plain_b.channel("A", 0, "x").recv(timeout_s=30) == b"no stage of ours on B"
        # the same job declared with another map (e.g. without its stages) is refused, audited
        with pytest.raises(ChannelError, match=r"stage_map_mismatch: job 'j' of account 'ops' runs here with stage "
                                               r"map .*start every worker of a job from the same job file"):
            Endpoint.connect(ops_a, job="j", rank=1, timeout_s=20)
        rec = wait_audit(a, lambda r: r["action"] == "frame_refused" and r["detail"]["reason"] == "stage_map_mismatch")
        assert rec["outcome"] == "denied" and rec["detail"]["account"] == "ops"
        # `stage:*` covers every stage, applied without a SIGHUP (accounts.db is watched)
        grant(capsys, home, "add", "--to", "ops", "--resource", "stage:*")
        wait_audit(a, lambda r: r["action"] == "route_grants_reload" and r["outcome"] == "ok")
        with Endpoint.connect(ops_b, job="j", rank=0, stages=JOB) as ob:
            oa.channel("B", 0, "y").send(b"granted now")
            assert ob.channel("A", 0, "y").recv(timeout_s=30) == b"granted now"
    legit.join(120)
    assert [int.from_bytes(m[:4], "big") for m in done] == list(range(MESSAGES))  # nothing lost or reordered


def test_a_worker_may_not_run_a_stage_it_holds_no_grant_for(staged, capsys):
    fed, a, home, ops_a, _ = staged
    legit, done = legit_transfer(fed, MESSAGES, job="legit", stages=JOB, src="A", dst="B")  # nebula: granted
    swapped = {"enc": "B", "dec": "A"}  # ops would run dec on A
    with pytest.raises(SwitchRefused, match=r"not_authorized: account 'ops' holds no grant for stage 'dec'; an admin "
                                           r"can run `nebula-admin grant add --to ops --resource stage:dec`"):
        Endpoint.connect(ops_a, job="j", rank=0, stages=swapped, timeout_s=20)
    rec = wait_audit(a, lambda r: r["action"] == "route_refused" and r["detail"].get("stages") == ["dec"])
    assert rec["detail"]["cluster"] == "A" and rec["detail"]["account"] == "ops"
    grant(capsys, home, "add", "--to", "ops", "--resource", "stage:dec")
    wait_audit(a, lambda r: r["action"] == "route_grants_reload" and r["outcome"] == "ok")
    with Endpoint.connect(ops_a, job="j", rank=0, stages=swapped, timeout_s=20) as oa:
        assert oa.cluster == "A"  # granted: registered
    legit.join(120)
    assert [int.from_bytes(m[:4], "big") for m in done] == list(range(MESSAGES))
