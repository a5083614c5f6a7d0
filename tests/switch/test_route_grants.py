"""Route grants enforced by real switch servers: an account's workers reach only the clusters it holds a grant
for, revocations apply without a SIGHUP, refusals are audited, other accounts' traffic flows; fail-closed start
and private worker keys."""
from __future__ import annotations

import os
import json
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from nebula.channel import ChannelError, Endpoint
from nebula.config.switch import load_switch_config
from security.accounts import Accounts
from security.cli import main as admin_main
from switch_server.status import status_path
from testbed.federation import edit_yaml, start_switch, wait_audit
from tests.switch.conftest import worker_yaml
from testbed.attackers import add_worker, refused


def grant(capsys, home: Path, *argv: str) -> str:
    """Run `nebula-admin grant ...` on `home`; its stdout."""
    code = admin_main(["--actor", "ops-admin", "grant", argv[0], "--home", str(home), *argv[1:]])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


@pytest.fixture
def granted(procs, federation, tmp_path, capsys, monkeypatch):
    """A's switch enforcing the route grants of an account home in which only account nebula may reach B; an
    ops worker on A and on B. Returns (fed, A, B, home, ops worker.yaml on A, ops worker.yaml on B)."""
    monkeypatch.setenv("NEBULA_ACTOR", "ops-admin")  # (nebula-admin sets it for the process: undone afterwards)
    home = tmp_path / "home"
    with Accounts(home, scrypt_n=1024) as acc:
        acc.add_user("admin", "admin-password", "admin", actor="root")
        for account in ("nebula", "ops"):  # the workers' accounts: grants are only for accounts that exist
            acc.add_user(account, f"{account}-password", actor="root")
    out = grant(capsys, home, "add", "--to", "nebula", "--resource", "cluster:B")
    assert out.startswith("grant r1:")
    ops_a, ops_b = add_worker(federation, "A", "opsw", "ops"), add_worker(federation, "B", "opsw", "ops")
    a_yaml = Path(federation["clusters"]["A"]["switch_yaml"])
    edit_yaml(a_yaml, lambda d: d.update(accounts_home=os.path.relpath(home, a_yaml.parent)))
    a = start_switch(procs, a_yaml)
    b = start_switch(procs, Path(federation["clusters"]["B"]["switch_yaml"]))
    return federation, a, b, home, ops_a, ops_b


def test_only_granted_accounts_reach_other_clusters_and_revocation_applies_live(granted, capsys):
    fed, a, b, home, ops_a, ops_b = granted
    with Endpoint.connect(worker_yaml(fed, "A"), job="j", rank=0) as na, \
            Endpoint.connect(worker_yaml(fed, "B"), job="j", rank=0) as nb:
        na.channel("B", 0, "x").send(b"granted")
        assert nb.channel("A", 0, "x").recv(timeout_s=30) == b"granted"
        # ops holds no grant while cluster grants are in use: refused with the fix, audited; nebula unaffected
        with Endpoint.connect(ops_a, job="j", rank=0) as oa:
            why = refused(oa, "B")
        assert "not_authorized" in why and "account 'ops'" in why and "cluster 'B'" in why
        assert "nebula-admin grant add --to ops --resource cluster:B" in why
        rec = wait_audit(a, lambda r: r["action"] == "route_refused" and r["detail"]["account"] == "ops")
        assert rec["outcome"] == "denied" and rec["detail"]["cluster"] == "B" and rec["actor"] == "switch:A"
        na.channel("B", 0, "x").send(b"still granted")
        assert nb.channel("A", 0, "x").recv(timeout_s=30) == b"still granted"
        # grants change without a SIGHUP: the switch notices accounts.db changed
        grant(capsys, home, "add", "--to", "ops", "--resource", "cluster:B")
        grant(capsys, home, "revoke", "--id", "r1")
        # (re-read once only ops holds a live cluster grant: after the revocation)
        rec = wait_audit(a, lambda r: r["action"] == "route_grants_reload" and r["detail"].get("accounts") == 1)
        assert rec["outcome"] == "ok" and rec["target"] == str(home.resolve())
        why = refused(na, "B")
        assert "account 'nebula' holds no grant for cluster 'B'" in why
        assert "nebula-admin grant add --to nebula --resource cluster:B" in why
        wait_audit(a, lambda r: r["action"] == "route_refused" and r["detail"]["account"] == "nebula")
        st = json.loads(status_path(load_switch_config(a.config)).read_text())
        metrics = urllib.request.urlopen(f"http://{st['metrics']}/metrics", timeout=10).read().decode()
        ids = {name: i for i, name in json.loads((status_path(load_switch_config(a.config)).parent
                                                  / "metric_accounts.json").read_text()).items()}
        for account in ("ops", "nebula"):  # (labelled by opaque ids, which the state directory maps to names)
            assert re.search(rf'nebula_switch_route_refused_frames_total{{account="{ids[account]}",cluster="B"}} [1-9]',
                             metrics) and f'"{account}"' not in metrics
        with Endpoint.connect(ops_a, job="k", rank=0) as oa, Endpoint.connect(ops_b, job="k", rank=1) as ob:
            oa.channel("B", 1, "x").send(b"ops now granted")
            assert ob.channel("A", 0, "x").recv(timeout_s=30) == b"ops now granted"
            # traffic within the cluster is never restricted by route grants
            with Endpoint.connect(worker_yaml(fed, "A"), job="j", rank=1) as na1:
                na1.channel("A", 0, "y").send(b"local")
                assert na.channel("A", 1, "y").recv(timeout_s=30) == b"local"


def test_unreadable_accounts_home_stops_start_up(federation, tmp_path):
    a_yaml = Path(federation["clusters"]["A"]["switch_yaml"])
    edit_yaml(a_yaml, lambda d: d.update(accounts_home=str(tmp_path / "nowhere")))
    proc = subprocess.run([sys.executable, "-m", "switch_server.cli", "serve", "--config", str(a_yaml)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert f"no account database {tmp_path / 'nowhere' / 'accounts.db'}" in proc.stderr
    assert "nebula-admin user add" in proc.stderr and "remove accounts_home" in proc.stderr


def test_world_readable_worker_key_is_refused_with_the_fix(federation):
    wy = Path(worker_yaml(federation, "A"))
    key = wy.parent / "workers" / "worker.key_secret"
    assert os.stat(key).st_mode & 0o777 == 0o600  # as provisioned
    os.chmod(key, 0o644)
    with pytest.raises(ChannelError, match=r"worker CURVE key .*worker.key_secret has mode 0644.*chmod 600"):
        Endpoint.connect(wy, job="j", rank=0, timeout_s=5)


def test_sighup_starts_enforcing_and_refuses_an_unreadable_home(procs, federation, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("NEBULA_ACTOR", "ops-admin")
    home = tmp_path / "home"
    with Accounts(home, scrypt_n=1024) as acc:
        acc.add_user("admin", "admin-password", "admin", actor="root")
        for account in ("nebula", "ops"):  # the workers' accounts: grants are only for accounts that exist
            acc.add_user(account, f"{account}-password", actor="root")
    grant(capsys, home, "add", "--to", "ops", "--resource", "cluster:B")
    a_yaml = Path(federation["clusters"]["A"]["switch_yaml"])
    a = start_switch(procs, a_yaml)
    start_switch(procs, Path(federation["clusters"]["B"]["switch_yaml"]))
    edit_yaml(a_yaml, lambda d: d.update(accounts_home=str(tmp_path / "nowhere")))
    a.hup()
    rec = wait_audit(a, lambda r: r["action"] == "reload" and r["outcome"] == "error")
    assert "no account database" in rec["detail"]["reason"]
    with Endpoint.connect(worker_yaml(federation, "A"), job="j", rank=0) as na, \
            Endpoint.connect(worker_yaml(federation, "B"), job="j", rank=0) as nb:
        na.channel("B", 0, "x").send(b"unrestricted")  # the refused reload left no route restriction in force
        assert nb.channel("A", 0, "x").recv(timeout_s=30) == b"unrestricted"
        edit_yaml(a_yaml, lambda d: d.update(accounts_home=str(home)))
        a.hup()
        wait_audit(a, lambda r: r["action"] == "reload" and r["outcome"] == "ok")
        assert "nebula-admin grant add --to nebula --resource cluster:B" in refused(na, "B")
