"""Route grants: which clusters and stages an account's workers may address, administered with nebula-admin grant
and read by the switch through a read-only policy snapshot."""
from __future__ import annotations

import json

import pytest

from security.accounts import Accounts
from security.audit import read_records
from security.cli import main
from security.errors import AccountError
from security.routes import load_route_policy, policy_from_rows


@pytest.fixture
def home(tmp_path):
    with Accounts(tmp_path / "home", scrypt_n=1024) as acc:
        acc.add_user("admin", "admin-password", "admin", actor="root")
        acc.add_user("nebula", "worker-account-pw", actor="root")  # the workers' account: grants need it to exist
    return tmp_path / "home"


def admin(capsys, home, *argv: str) -> tuple[int, str, str]:
    code = main(["--actor", "ops", "grant", *argv[:1], "--home", str(home), *argv[1:]])
    out, err = capsys.readouterr()
    return code, out, err


def test_cluster_grants_are_enforced_once_in_use_and_revocable(home, capsys):
    size = (home / "audit.log").stat().st_size
    before = load_route_policy(home)
    assert before.allowed_clusters("nebula") is None and before.refusal("nebula", "B") is None  # not in use yet
    assert (home / "audit.log").stat().st_size == size  # reading the policy writes nothing

    code, out, _ = admin(capsys, home, "add", "--to", "nebula", "--resource", "cluster:B")
    assert code == 0 and out.startswith("grant r1: nebula's workers may address cluster:B")
    policy = load_route_policy(home)
    assert policy.allowed_clusters("nebula") == frozenset({"B"})
    assert policy.refusal("nebula", "B") is None
    assert policy.refusal("nebula", "C") == ("account 'nebula' holds no grant for cluster 'C'; an admin can run "
                                             "`nebula-admin grant add --to nebula --resource cluster:C`")
    assert policy.allowed_clusters("mallory") == frozenset() and policy.refusal("mallory", "B") is not None
    assert policy.allowed_stages("nebula") is None  # stage grants not in use: stages unrestricted
    with Accounts(home, create=False) as acc:
        assert acc.allowed_clusters("nebula") == frozenset({"B"})

    code, out, _ = admin(capsys, home, "list", "--json")
    assert [(g["id"], g["grantee"], g["resource"], g["status"]) for g in json.loads(out)] == \
        [("r1", "nebula", "cluster:B", "active")]
    assert admin(capsys, home, "revoke", "--id", "r1")[0] == 0
    assert load_route_policy(home).allowed_clusters("nebula") == frozenset()  # still in use: nothing granted now
    code, _, err = admin(capsys, home, "revoke", "--id", "r1")
    assert code == 1 and "route grant r1 is already revoked" in err

    recs = [r for r in read_records(home / "audit.log") if r["action"].startswith("grant.")]
    assert [(r["actor"], r["action"], r["target"], r["detail"]["resource"]) for r in recs] == \
        [("ops", "grant.add", "nebula", "cluster:B"), ("ops", "grant.revoke", "nebula", "cluster:B")]


def test_wildcard_stage_grants_and_expiry(home, capsys):
    assert admin(capsys, home, "add", "--to", "nebula", "--resource", "cluster:*")[0] == 0
    assert admin(capsys, home, "add", "--to", "nebula", "--resource", "stage:encoder", "--expires", "7d")[0] == 0
    policy = load_route_policy(home)
    assert policy.refusal("nebula", "anywhere") is None and policy.refusal("nebula", "B", ("encoder",)) is None
    assert "no grant for stage 'decoder'" in policy.refusal("nebula", "B", ("encoder", "decoder"))
    assert "no grant for stage 'decoder'" in policy.refusal("nebula", None, ("decoder",))  # (stages only)
    assert admin(capsys, home, "add", "--to", "nebula", "--resource", "stage:*")[0] == 0
    assert load_route_policy(home).refusal("nebula", None, ("encoder", "decoder")) is None
    past = policy_from_rows([("nebula", "cluster", "B", "2000-01-01T00:00:00Z", None),
                             ("nebula", "cluster", "C", None, "2020-01-01T00:00:00Z")])
    assert past.allowed_clusters("nebula") == frozenset()  # expired and revoked grants count for nothing


def test_route_grant_bad_input_names_the_fix(home, capsys, tmp_path):
    code, _, err = admin(capsys, home, "add", "--owner", "admin", "--to", "nebula", "--resource", "cluster:B")
    assert code == 1 and "route grant, which has no owner; drop --owner" in err
    code, _, err = admin(capsys, home, "add", "--to", "nebula", "--resource", "data/x")
    assert code == 1 and "--owner is needed" in err
    code, _, err = admin(capsys, home, "add", "--to", "nebula", "--resource", "cluster:../B")
    assert code == 1 and "not a valid name" in err
    code, _, err = admin(capsys, home, "revoke", "--id", "rx")
    assert code == 1 and "is not a grant id" in err
    code, _, err = admin(capsys, home, "add", "--to", "nebula", "--resource", "cluster:B", "--expires", "2000-01-01")
    assert code == 1 and "in the past" in err
    with pytest.raises(AccountError, match="no account database"):
        load_route_policy(tmp_path / "nowhere")


def test_a_grant_for_an_account_that_does_not_exist_is_refused_with_the_fix(home, capsys):
    code, out, err = admin(capsys, home, "add", "--to", "nebulla", "--resource", "cluster:B")  # a typo
    assert code == 1 and out == "" and len(err.splitlines()) == 1
    assert "unknown user 'nebulla'" in err and f"nebula-admin user add --home {home} nebulla" in err
    with Accounts(home, create=False) as acc:
        assert acc.list_route_grants() == []
        with pytest.raises(AccountError, match="unknown user 'ghost'"):
            acc.add_route_grant("ghost", "job:langid", actor="ops")
        assert acc.list_route_grants() == []
    code, _, err = main(["grant", "add", "--home", str(home), "--owner", "admin", "--to", "ghost",
                         "--resource", "data/x"]), *capsys.readouterr()
    assert code == 1 and "nebula-admin user add --home" in err  # namespace grants name the same fix


def test_names_a_worker_or_client_chose_are_escaped_and_bounded_in_refusals(home, capsys):
    assert admin(capsys, home, "add", "--to", "nebula", "--resource", "stage:enc")[0] == 0
    assert admin(capsys, home, "add", "--to", "nebula", "--resource", "job:langid")[0] == 0
    policy = load_route_policy(home)
    forged = "dec\nOK nothing refused\x1b[2K\u202e" + "x" * 5000  # a newline, an ANSI erase-line, a bidi override
    why = policy.refusal("nebula", None, ("enc", forged))
    assert why.isprintable() and len(why) < 300  # one line, nothing a terminal acts on, bounded
    assert r"dec\nOK nothing refused\x1b[2K\u202e" in why and "chars)" in why
    assert "grant add" not in why and "fix the job or config" in why  # no command to copy for an invalid name
    fix = "`nebula-admin grant add --to nebula --resource stage:dec`"
    assert policy.refusal("nebula", None, ("dec",)).endswith(fix)
    why = policy.job_refusal("nebula", "evil\r\nOK")
    assert why.isprintable() and r"job 'evil\r\nOK'" in why
