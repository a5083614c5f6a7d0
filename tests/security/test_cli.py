"""nebula-admin end to end: each command's happy path and its bad input (clear message, non-zero exit)."""
from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from security.ca import CertificateAuthority
from security.cli import main

OPENSSL = "/usr/bin/openssl"


def run(capsys, *argv: str, stdin: str | None = None, monkeypatch=None) -> tuple[int, str, str]:
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin.encode())))
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_console_script_runs_ca_lifecycle_and_openssl_agrees(tmp_path):
    exe = Path(sys.executable).parent / "nebula-admin"
    ca = tmp_path / "ca"

    def admin(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=60)

    assert admin("ca", "init", "--dir", str(ca), "--federation", "demo").returncode == 0
    r = admin("cert", "issue", "--ca", str(ca), "--name", "switch", "--role", "switch", "--cluster", "A",
              "--ip", "127.0.0.1", "--out", str(tmp_path / "A"))
    assert r.returncode == 0, r.stderr
    serial = r.stdout.split("serial ")[1].split(":")[0]
    assert admin("cert", "revoke", "--ca", str(ca), "--serial", serial, "--reason", "key_compromise").returncode == 0
    assert admin("crl", "--ca", str(ca), "--out", str(tmp_path / "crl.pem")).returncode == 0
    v = subprocess.run([OPENSSL, "verify", "-crl_check", "-CAfile", str(ca / "ca.pem"), "-CRLfile",
                        str(tmp_path / "crl.pem"), str(tmp_path / "A" / "switch.pem")], capture_output=True, text=True)
    assert v.returncode != 0 and "certificate revoked" in v.stderr
    again = admin("cert", "revoke", "--ca", str(ca), "--serial", serial)
    assert again.returncode == 1 and f"serial {serial} is already revoked" in again.stderr
    listing = admin("cert", "list", "--ca", str(ca))
    assert listing.returncode == 0 and serial in listing.stdout and "revoked" in listing.stdout
    assert admin("cert", "issue", "--ca", str(ca), "--name", "x", "--role", "root", "--out", "o").returncode == 2


def test_cert_commands_csr_sign_renew_list_json(tmp_path, capsys):
    ca = tmp_path / "ca"
    assert run(capsys, "ca", "init", "--dir", str(ca), "--federation", "demo")[0] == 0
    assert run(capsys, "cert", "csr", "--name", "w1", "--out", str(tmp_path / "host"))[0] == 0
    code, out, _ = run(capsys, "cert", "sign", "--ca", str(ca), "--csr", str(tmp_path / "host" / "w1.csr"),
                       "--role", "worker", "--cluster", "B")
    assert code == 0 and (tmp_path / "host" / "w1.pem").exists()
    code, out, _ = run(capsys, "cert", "list", "--ca", str(ca), "--json")
    rows = json.loads(out)
    assert code == 0 and [(r["identity"], r["status"]) for r in rows] == [("spiffe://demo/worker/B/w1", "valid")]
    code, out, _ = run(capsys, "cert", "renew", "--ca", str(ca), "--serial", rows[0]["serial"], "--days", "2",
                       "--out", str(tmp_path / "host" / "w1-renewed.pem"), "--revoke-old")
    assert code == 0 and (tmp_path / "host" / "w1-renewed.pem").exists()
    statuses = sorted(r["status"] for r in json.loads(run(capsys, "cert", "list", "--ca", str(ca), "--json")[1]))
    assert statuses == ["revoked", "valid"]
    code, _, err = run(capsys, "cert", "sign", "--ca", str(ca), "--csr", str(tmp_path / "nope.csr"), "--role", "user")
    assert code == 1 and "nope.csr does not exist" in err


def test_wrong_passphrase_missing_ca_and_unknown_serial(tmp_path, capsys, monkeypatch):
    ca = tmp_path / "ca"
    monkeypatch.setenv("CA_PW", "right-one")
    assert run(capsys, "ca", "init", "--dir", str(ca), "--passphrase-env", "CA_PW")[0] == 0
    monkeypatch.setenv("CA_PW", "wrong-one")
    code, _, err = run(capsys, "cert", "issue", "--ca", str(ca), "--name", "u", "--role", "user", "--out",
                       str(tmp_path / "u"), "--passphrase-env", "CA_PW")
    assert code == 1 and "wrong passphrase for CA key" in err and not (tmp_path / "u").exists()
    code, _, err = run(capsys, "crl", "--ca", str(ca))
    assert code == 1 and "is encrypted; supply its passphrase (--passphrase-env VAR)" in err
    code, _, err = run(capsys, "cert", "list", "--ca", str(tmp_path / "missing"))
    assert code == 1 and "does not exist; create it with `nebula-admin ca init" in err
    monkeypatch.setenv("CA_PW", "right-one")
    code, _, err = run(capsys, "cert", "revoke", "--ca", str(ca), "--serial", "abc123", "--passphrase-env", "CA_PW")
    assert code == 1 and "serial abc123 was not issued by this CA" in err
    code, _, err = run(capsys, "cert", "revoke", "--ca", str(ca), "--serial", "1", "--passphrase-env", "UNSET_VAR")
    assert code == 1 and "environment variable UNSET_VAR is not set" in err


def test_provision_command(tmp_path, capsys):
    code, out, _ = run(capsys, "provision", "--federation", "demo", "--clusters", "A,B", "--out", str(tmp_path / "d"),
                       "--json")
    summary = json.loads(out)
    assert code == 0 and set(summary["clusters"]) == {"A", "B"}
    assert (tmp_path / "d" / "A" / "switch.yaml").exists() and (tmp_path / "d" / "B" / "worker.yaml").exists()
    code, _, err = run(capsys, "provision", "--federation", "demo", "--clusters", "A", "--out", str(tmp_path / "d"))
    assert code == 1 and "already exists" in err
    code, _, err = run(capsys, "provision", "--federation", "demo", "--clusters", "A,../x",
                       "--out", str(tmp_path / "e"))
    assert code == 1 and "cluster '../x' is not a valid name" in err


def test_users_grants_data_and_audit_from_the_cli(tmp_path, capsys, monkeypatch):
    home = str(tmp_path / "home")
    monkeypatch.setenv("NEBULA_HOME", home)
    for name, pw in (("alice", "alice-password"), ("bob", "bob-password")):
        code, out, _ = run(capsys, "--actor", "root", "user", "add", name, "--password-stdin", "--scrypt-n", "1024",
                           stdin=pw + "\n", monkeypatch=monkeypatch)
        assert code == 0 and f"added user {name}" in out
    code, _, err = run(capsys, "user", "add", "alice", "--password-stdin", "--scrypt-n", "1024",
                       stdin="whatever-pw\n", monkeypatch=monkeypatch)
    assert code == 1 and "user 'alice' already exists" in err
    code, _, err = run(capsys, "user", "lock", "zed")
    assert code == 1 and "unknown user 'zed'" in err
    code, _, _ = run(capsys, "data", "write", "--as", "alice", "--owner", "alice", "--resource", "data/c.txt",
                     stdin="", monkeypatch=monkeypatch)
    assert code == 0
    (Path(home) / "users" / "alice" / "data" / "c.txt").write_text("corpus")
    code, _, err = run(capsys, "data", "read", "--as", "bob", "--owner", "alice", "--resource", "data/c.txt")
    assert code == 1 and "'bob' has no grant on alice:data/c.txt" in err
    code, out, _ = run(capsys, "--actor", "alice", "grant", "add", "--owner", "alice", "--to", "bob",
                       "--resource", "data", "--expires", "2h")
    assert code == 0 and out.startswith("grant 1: bob may read alice:data until ")
    code, _, err = run(capsys, "grant", "add", "--owner", "alice", "--to", "bob", "--resource", "data",
                       "--expires", "2001-01-01")
    assert code == 1 and "is in the past" in err
    code, _, err = run(capsys, "grant", "add", "--owner", "alice", "--to", "bob", "--resource", "data",
                       "--expires", "soon")
    assert code == 1 and "--expires 'soon' is not a time" in err
    code, out, _ = run(capsys, "grant", "list", "--json")
    assert [(g["id"], g["status"]) for g in json.loads(out)] == [(1, "active")]
    capsys.readouterr()
    code = main(["data", "read", "--as", "bob", "--owner", "alice", "--resource", "data/c.txt"])
    assert code == 0
    assert run(capsys, "grant", "revoke", "--id", "1")[0] == 0
    code, _, err = run(capsys, "grant", "revoke", "--id", "7")
    assert code == 1 and "grant 7 does not exist" in err
    # lockout through the CLI: five wrong passwords lock the account
    for _ in range(5):
        code, _, err = run(capsys, "user", "login", "bob", "--password-stdin", stdin="nope-nope\n",
                           monkeypatch=monkeypatch)
        assert code == 1
    assert "now locked after 5 failed logins" in err
    code, out, _ = run(capsys, "user", "list", "--json")
    assert {u["name"]: u["locked"] for u in json.loads(out)} == {"alice": False, "bob": True}
    assert run(capsys, "user", "unlock", "bob")[0] == 0
    code, out, _ = run(capsys, "user", "login", "bob", "--password-stdin", stdin="bob-password\n",
                       monkeypatch=monkeypatch)
    assert code == 0 and out.startswith("ok: bob")
    log = str(Path(home) / "audit.log")
    code, out, _ = run(capsys, "audit", "show", "--log", log, "--user", "bob", "--action", "data", "--json")
    recs = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and [(r["outcome"]) for r in recs] == ["denied", "ok"]
    code, out, _ = run(capsys, "audit", "show", "--log", log, "--action", "grant", "--since", "1h")
    assert code == 0 and out.count("grant.add") == 1 and "grant.revoke" in out and out.startswith("SEQ")
    code, out, _ = run(capsys, "audit", "show", "--log", log, "--since", "2999-01-01", "--json")
    assert code == 0 and out == ""
    code, out, _ = run(capsys, "audit", "verify", "--log", log, "--key", str(Path(home) / "audit_signing.key"))
    assert code == 0 and out.startswith("OK")
    lines = Path(log).read_text().splitlines(keepends=True)
    n = next(i for i, line in enumerate(lines) if i > 0 and '"target":"alice"' in line)
    lines[n] = lines[n].replace('"target":"alice"', '"target":"mallory"')
    Path(log).write_text("".join(lines))
    code, out, _ = run(capsys, "audit", "verify", "--log", log)
    assert code == 1 and "TAMPERED" in out and f"first bad record {n + 1}" in out


def test_audit_keygen_refuses_to_overwrite(tmp_path, capsys):
    code, out, _ = run(capsys, "audit", "keygen", "--out", str(tmp_path / "k.key"))
    assert code == 0 and out.startswith("-----BEGIN PUBLIC KEY-----")
    code, _, err = run(capsys, "audit", "keygen", "--out", str(tmp_path / "k.key"))
    assert code == 1 and "never overwritten" in err


def test_every_cli_ca_operation_is_audited(tmp_path, capsys):
    ca = tmp_path / "ca"
    run(capsys, "--actor", "ops", "ca", "init", "--dir", str(ca))
    run(capsys, "--actor", "ops", "cert", "issue", "--ca", str(ca), "--name", "bob", "--role", "user", "--out",
        str(tmp_path / "b"))
    code, out, _ = run(capsys, "audit", "show", "--log", str(ca / "audit.log"), "--json")
    recs = [json.loads(line) for line in out.splitlines()]
    assert [(r["actor"], r["action"]) for r in recs] == [("ops", "ca.init"), ("ops", "cert.issue")]
    assert CertificateAuthority.open(ca).federation == "nebula"


@pytest.fixture(autouse=True)
def _no_actor_leak(monkeypatch):
    monkeypatch.delenv("NEBULA_ACTOR", raising=False)
