"""Accounts, lockout, namespaces and grants on a real SQLite store; every access decision is audited."""
from __future__ import annotations

import os
import sqlite3
import stat

import datetime as dt
import pytest

from security.accounts import Accounts, hash_password, verify_password
from security.audit import read_records
from security.audit_verify import verify_log
from security.errors import AccessDenied, AccountError, AccountLocked, AuthenticationFailed

N = 1024  # scrypt cost lowered for tests only; the default stays at 2**17


@pytest.fixture
def acc(tmp_path):
    with Accounts(tmp_path / "home", scrypt_n=N, max_failures=3) as store:
        store.add_user("alice", "alice-password", actor="root")
        store.add_user("bob", "bob-password", actor="root")
        store.add_user("carol", "carol-password", "admin", actor="root")
        yield store


def write(acc: Accounts, owner: str, resource: str, data: bytes) -> None:
    with acc.open_resource(owner, owner, resource, "wb") as f:
        f.write(data)


def actions(acc: Accounts) -> list[tuple[str, str, str, str]]:
    return [(r["actor"], r["action"], r["target"], r["outcome"]) for r in read_records(acc.audit.path)]


def test_passwords_are_stored_only_as_scrypt_hashes(acc):
    raw = (acc.home / "accounts.db").read_bytes()
    assert b"alice-password" not in raw
    with sqlite3.connect(acc.home / "accounts.db") as db:
        stored = db.execute("SELECT pw_hash FROM users WHERE name='alice'").fetchone()[0]
    assert stored.startswith("scrypt$1024$8$1$") and verify_password("alice-password", stored)
    assert not verify_password("alice-passwore", stored)
    assert hash_password("x" * 8, n=N) != hash_password("x" * 8, n=N)  # salted
    assert stat.S_IMODE(os.stat(acc.home / "accounts.db").st_mode) == 0o600


def test_namespaces_are_private_directories(acc):
    for user in ("alice", "bob"):
        ns = acc.namespace(user)
        assert stat.S_IMODE(os.stat(ns).st_mode) == 0o700
        for sub in ("data", "jobs", "checkpoints"):
            assert stat.S_IMODE(os.stat(ns / sub).st_mode) == 0o700


def test_add_user_errors(acc):
    with pytest.raises(AccountError, match="user 'alice' already exists"):
        acc.add_user("alice", "another-password")
    with pytest.raises(AccountError, match="too short"):
        acc.add_user("dave", "short")
    with pytest.raises(AccountError, match="not a valid name"):
        acc.add_user("../dave", "long-enough-pw")
    with pytest.raises(AccountError, match="role 'root' is unknown"):
        acc.add_user("dave", "long-enough-pw", "root")
    with pytest.raises(AccountError, match="unknown user 'zed'"):
        acc.lock("zed")
    assert [a.name for a in acc.list_users()] == ["alice", "bob", "carol"]
    assert ("root", "user.add", "alice", "failed") in actions(acc)


def test_lockout_after_repeated_failures_and_unlock(acc):
    assert acc.authenticate("alice", "alice-password").name == "alice"
    with pytest.raises(AuthenticationFailed, match="2 attempts left"):
        acc.authenticate("alice", "wrong-1")
    with pytest.raises(AuthenticationFailed, match="1 attempts left"):
        acc.authenticate("alice", "wrong-2")
    with pytest.raises(AccountLocked, match="now locked after 3 failed logins"):
        acc.authenticate("alice", "wrong-3")
    with pytest.raises(AccountLocked, match="user unlock alice"):
        acc.authenticate("alice", "alice-password")  # the right password no longer helps
    assert acc.user("alice").locked and acc.user("alice").failed_attempts == 3
    acc.unlock("alice", actor="carol")
    assert acc.authenticate("alice", "alice-password").failed_attempts == 0
    with pytest.raises(AuthenticationFailed, match="unknown user or wrong password"):
        acc.authenticate("nobody", "whatever-pw")
    acc.set_password("alice", "new-alice-password", actor="carol")
    with pytest.raises(AuthenticationFailed):
        acc.authenticate("alice", "alice-password")
    assert acc.authenticate("alice", "new-alice-password").name == "alice"
    log = actions(acc)
    assert ("alice", "user.lock", "alice", "ok") in log and ("alice", "login", "alice", "denied") in log
    assert ("carol", "user.unlock", "alice", "ok") in log and ("carol", "user.passwd", "alice", "ok") in log


def test_access_without_grant_is_denied_and_audited(acc):
    write(acc, "alice", "data/corpus.txt", b"hola mundo")
    with pytest.raises(AccessDenied, match="'bob' has no grant on alice:data/corpus.txt"):
        acc.open_resource("bob", "alice", "data/corpus.txt")
    with acc.open_resource("alice", "alice", "data/corpus.txt") as f:
        assert f.read() == b"hola mundo"
    assert actions(acc)[-2:] == [("bob", "data.open", "alice:data/corpus.txt", "denied"),
                                 ("alice", "data.open", "alice:data/corpus.txt", "ok")]


def test_grant_allows_reading_only_what_it_covers(acc):
    write(acc, "alice", "data/corpus.txt", b"hola mundo")
    write(acc, "alice", "checkpoints/step1", b"weights")
    write(acc, "alice", "datax/other", b"not covered")
    g = acc.add_grant("alice", "bob", "data", actor="alice")
    with acc.open_resource("bob", "alice", "data/corpus.txt") as f:
        assert f.read() == b"hola mundo"
    for resource in ("checkpoints/step1", "datax/other"):
        with pytest.raises(AccessDenied, match="no grant"):
            acc.open_resource("bob", "alice", resource)
    with pytest.raises(AccessDenied, match="grants are read-only"):
        acc.open_resource("bob", "alice", "data/corpus.txt", "wb")
    with pytest.raises(AccessDenied, match="no grant"):
        acc.open_resource("carol", "alice", "data/corpus.txt")  # a grant is per grantee
    acc.revoke_grant(g.id, actor="alice")
    with pytest.raises(AccessDenied, match="no grant"):
        acc.open_resource("bob", "alice", "data/corpus.txt")
    with pytest.raises(AccountError, match="already revoked"):
        acc.revoke_grant(g.id)
    assert [x.status for x in acc.list_grants(owner="alice")] == ["revoked"]
    log = actions(acc)
    assert ("alice", "grant.add", "alice:data", "ok") in log and ("alice", "grant.revoke", "alice:data", "ok") in log
    assert ("bob", "data.open", "alice:data/corpus.txt", "ok") in log


def test_expired_grant_is_refused_with_its_expiry(acc):
    write(acc, "alice", "data/corpus.txt", b"x")
    g = acc.add_grant("alice", "bob", "data/corpus.txt",
                      dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=1), actor="alice")
    with acc.open_resource("bob", "alice", "data/corpus.txt") as f:
        assert f.read() == b"x"
    with sqlite3.connect(acc.home / "accounts.db") as db:  # let the hour pass
        db.execute("UPDATE grants SET expires='2000-01-01T00:00:00Z' WHERE id=?", (g.id,))
    assert acc.grant(g.id).status == "expired"
    with pytest.raises(AccessDenied, match="expired at 2000-01-01T00:00:00Z"):
        acc.open_resource("bob", "alice", "data/corpus.txt")
    with pytest.raises(AccountError, match="is in the past"):
        acc.add_grant("alice", "bob", "data", dt.datetime(2001, 1, 1, tzinfo=dt.timezone.utc))


def test_grant_input_errors_and_namespace_escapes(acc, tmp_path):
    with pytest.raises(AccountError, match="unknown user 'zed'"):
        acc.add_grant("alice", "zed", "data")
    with pytest.raises(AccountError, match="already owns"):
        acc.add_grant("alice", "alice", "data")
    with pytest.raises(AccountError, match="relative path inside"):
        acc.add_grant("alice", "bob", "../bob/data")
    with pytest.raises(AccountError, match="relative path inside"):
        acc.open_resource("alice", "alice", "/etc/passwd")
    write(acc, "bob", "data/secret", b"bob's")
    os.symlink(acc.namespace("bob") / "data" / "secret", acc.namespace("alice") / "data" / "link")
    acc.add_grant("alice", "carol", "data")
    for actor in ("alice", "carol"):
        with pytest.raises(AccessDenied, match="resolves outside"):
            acc.open_resource(actor, "alice", "data/link")
    with pytest.raises(AccountError, match="does not exist"):
        acc.open_resource("alice", "alice", "data/missing")
    acc.lock("carol")
    with pytest.raises(AccountLocked):
        acc.open_resource("carol", "alice", "data/corpus.txt")


def test_audit_log_of_the_store_verifies(acc):
    acc.add_grant("alice", "bob", "data", actor="alice")
    with pytest.raises(AccessDenied):
        acc.open_resource("carol", "alice", "data/x")
    acc.audit.checkpoint()
    report = verify_log(acc.audit.path)
    assert report.ok and report.records == len(actions(acc)) >= 5


def kdf_spy(monkeypatch) -> list[tuple[int, int, int, int]]:
    """Record the scrypt parameters of every KDF run (the real KDF still runs)."""
    import hashlib
    import security.passwords
    calls: list[tuple[int, int, int, int]] = []
    real = hashlib.scrypt

    def counting_scrypt(password, **kw):
        calls.append((kw["n"], kw["r"], kw["p"], kw["dklen"]))
        return real(password, **kw)

    monkeypatch.setattr(security.passwords.hashlib, "scrypt", counting_scrypt)
    return calls


def test_login_runs_the_password_kdf_for_unknown_and_locked_users_too(acc, monkeypatch):
    calls = kdf_spy(monkeypatch)
    kdf_runs = {}
    for name in ("alice", "nobody"):  # an existing user with a wrong password, and one that does not exist
        calls.clear()
        with pytest.raises(AuthenticationFailed, match="unknown user or wrong password"):
            acc.authenticate(name, "wrong-password")
        kdf_runs[name] = list(calls)
    assert kdf_runs["alice"] == kdf_runs["nobody"] == [(N, 8, 1, 32)]  # one KDF run at the same cost either way
    acc.lock("bob")
    calls.clear()
    with pytest.raises(AccountLocked):
        acc.authenticate("bob", "bob-password")
    assert calls == [(N, 8, 1, 32)]
    assert ("nobody", "login", "nobody", "failed") in actions(acc)


def test_login_work_is_the_same_whatever_cost_a_user_was_created_with(acc, monkeypatch):
    with Accounts(acc.home, scrypt_n=4 * N) as other:  # e.g. `user add --scrypt-n 4096`
        other.add_user("dave", "dave-password", actor="root")
    calls = kdf_spy(monkeypatch)
    work = {}
    for name in ("alice", "dave", "nobody"):  # cost N, cost 4N, no such user
        calls.clear()
        with pytest.raises(AuthenticationFailed):
            acc.authenticate(name, "wrong-password")
        work[name] = list(calls)
    assert work["alice"] == work["dave"] == work["nobody"] == [(N, 8, 1, 32), (4 * N, 8, 1, 32)]
    acc.lock("dave")
    for name, password in (("dave", "dave-password"), ("alice", "alice-password")):  # locked; right password
        calls.clear()
        try:
            acc.authenticate(name, password)
        except AccountLocked:
            pass
        assert calls == work["nobody"]
    assert acc.user("alice").failed_attempts == 0  # the right password still logs in
    assert ("nobody", "login", "nobody", "failed") in actions(acc)


def test_a_login_name_is_recorded_bounded_and_printable(acc):
    name = "eve\nOK login alice ok\x1b[31m" + "e" * 10_000
    name = name.encode().decode("unicode_escape")
    with pytest.raises(AuthenticationFailed) as info:
        acc.authenticate(name, "whatever-pw")
    assert str(info.value).isprintable() and len(str(info.value)) < 200
    rec = [r for r in read_records(acc.audit.path) if r["action"] == "login"][-1]
    assert rec["actor"] == rec["target"] and rec["actor"].isprintable() and len(rec["actor"]) <= 80
    assert rec["actor"].startswith("eve\\nOK login alice ok\\x1b[31m")
