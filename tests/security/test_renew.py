"""`nebula-admin provision renew`: a fresh CRL and renewed switch and worker certificates, as signed updates a site
applies with its own keys in place; nothing due writes nothing; a CSR made at the site from its key renews without the CA key
leaving the admin; a certificate for another cluster or role, or another key, is refused at the site. Also the
provision messages: site-relative worker paths, add-cluster without a port for a remote host refused, help text."""
from __future__ import annotations

import datetime as dt
import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from cryptography import x509

from security.ca import CertificateAuthority, make_csr
from security.errors import CAError
from security.federation import FederationError, load_federation
from security.kit_seal import CERT_FILE, KitError, check_kit
from security.provision import add_cluster, provision, renew
from security.updates import UpdateError, apply_update, write_update
from switch_server.csr import switch_csr
from testbed.federation import BIN
from testbed.procs import REPO

# printed in README.md ("Running a federation by hand"); run as printed by test_the_printed_renewal_commands_run
PRINTED = [
    "nebula-admin provision renew --out fed",
    "nebula-switch csr --config fed/A/switch.yaml --out req.pem",
    "nebula-admin provision renew --csr A=req.pem --out fed",
]


def _site(tmp_path: Path, out: Path, cluster: str) -> Path:
    """`cluster`'s kit unpacked at its own site; its switch.yaml."""
    site = tmp_path / f"site{cluster}"
    site.mkdir(exist_ok=True)
    subprocess.run(["tar", "xzf", str(out / "kits" / f"{cluster}.tar.gz"), "-C", str(site)], check=True)
    return site / cluster / "switch.yaml"


def _check(cfg: Path, peers=("B",)):
    return check_kit(cfg, federation="acme", cluster=cfg.parent.name, ca_path=cfg.parent / "ca.pem",
                     crl_path=cfg.parent / "crl.pem", peers=list(peers))


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _audit(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "ca" / "audit.log").read_text().splitlines() if line.strip()]


def test_renew_sends_every_site_a_fresh_crl_and_its_renewed_certificate_for_its_own_key(tmp_path):
    out = tmp_path / "fed"
    provision("acme", ["A", "B"], out)
    cfg = _site(tmp_path, out, "A")
    old = _cert(cfg.parent / CERT_FILE)
    old_worker = _cert(cfg.parent / "workers" / "worker.pem")
    keys_before = [(cfg.parent / k).read_bytes() for k in ("switch.key", "workers/worker.key")]

    got = renew(out, renew_all=True)

    assert not got["nothing_due"] and sorted(got["renewed"]) == ["A", "B"] and sorted(got["updates"]) == ["A", "B"]
    assert sorted(got["renewed_workers"]) == ["A", "B"] and list(got["renewed_workers"]["A"]) == ["worker"]
    said = apply_update(cfg, Path(got["updates"]["A"]))
    assert f"certificate renewed (serial {got['renewed']['A']['serial']}" in said
    assert "worker certificate(s) renewed: worker" in said
    for path, before in ((CERT_FILE, old), ("workers/worker.pem", old_worker)):
        new = _cert(cfg.parent / path)
        assert new.serial_number != before.serial_number and new.public_key() == before.public_key()
    assert f"{_cert(cfg.parent / 'workers/worker.pem').serial_number:x}" == \
        got["renewed_workers"]["A"]["worker"]["serial"]
    # the keys are the site's: untouched
    assert [(cfg.parent / k).read_bytes() for k in ("switch.key", "workers/worker.key")] == keys_before
    state = _check(cfg)  # the kit check takes the certificates the applied update signs
    assert state.revision == got["revision"] and state.crl_number > 1
    actions = [r["action"] for r in _audit(out)]
    assert actions.count("federation.renew_certificate") == 4 and "federation.renew" in actions
    # the old certificates stay valid (live sessions made with them go on); all are revoked if the cluster leaves
    assert all(r.status == "valid" for r in CertificateAuthority.open(out / "ca").list())
    assert len(json.loads((out / "state.json").read_text())["clusters"]["A"]["serials"]) == 4
    # a later update that renews nothing still carries them, and the kit check still takes them
    again = renew(out, crl_margin_days=30)
    assert again["renewed"] == {} and again["renewed_workers"] == {}
    apply_update(cfg, Path(again["updates"]["A"]))
    assert _check(cfg).revision == again["revision"]


def test_a_renew_with_nothing_due_writes_nothing_and_a_crl_near_its_next_update_is_refreshed(tmp_path):
    out = tmp_path / "fed"
    provision("acme", ["A", "B"], out)
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}

    idle = renew(out)

    assert idle["nothing_due"] and idle["revision"] == 1
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()} == before
    # a CRL whose next update is within the margin is refreshed (no certificate is due) and sent to every site
    cfg = _site(tmp_path, out, "A")
    number = _check(cfg).crl_number
    due = renew(out, crl_margin_days=30)
    assert not due["nothing_due"] and due["renewed"] == {} and sorted(due["updates"]) == ["A", "B"]
    apply_update(cfg, Path(due["updates"]["A"]))
    assert _check(cfg).crl_number > number


def test_a_certificate_within_the_margin_is_renewed_and_the_others_are_not(tmp_path):
    out = tmp_path / "fed"
    provision("acme", ["A", "B"], out)
    left = (_cert(out / "A" / CERT_FILE).not_valid_after_utc - dt.datetime.now(dt.timezone.utc)).days
    got = renew(out, margin_days=left + 1)  # every certificate has less than that left
    assert sorted(got["renewed"]) == ["A", "B"] and sorted(got["renewed_workers"]) == ["A", "B"]
    again = renew(out, margin_days=left - 5)  # the renewed ones have a full lifetime again
    assert again["nothing_due"]


def test_a_site_renews_by_csr_from_its_own_key(tmp_path):
    out = tmp_path / "fed"
    provision("acme", ["A", "B"], out)
    cfg = _site(tmp_path, out, "A")
    req, uri = switch_csr(cfg, tmp_path / "req.pem")
    assert uri == "spiffe://acme/switch/A/switch"

    got = renew(out, csrs={"A": req})

    assert sorted(got["renewed"]) == ["A"] and got["renewed"]["A"]["csr"] == str(req)
    apply_update(cfg, Path(got["updates"]["A"]))
    assert f"{_cert(cfg.parent / CERT_FILE).serial_number:x}" == got["renewed"]["A"]["serial"]
    _check(cfg)
    # B's CSR must be B's: A's request for B, or a request for another key, is refused with nothing written
    with pytest.raises(CAError, match="not B's switch"):
        renew(out, csrs={"B": req})
    stranger, _ = make_csr("switch", tmp_path / "k")
    with pytest.raises(CAError, match="another key"):
        renew(out, csrs={"A": stranger})
    assert json.loads((out / "state.json").read_text())["revision"] == got["revision"]


def test_the_site_refuses_a_signed_update_carrying_a_certificate_of_another_cluster_role_or_key(tmp_path):
    out = tmp_path / "fed"
    provision("acme", ["A", "B"], out)
    cfg = _site(tmp_path, out, "A")
    ca = CertificateAuthority.open(out / "ca")
    spec = load_federation(out / "federation.yaml")
    a = spec.cluster("A")
    worker = (out / "A" / "workers" / "worker.pem").read_bytes()
    foreign = ca.issue("switch", "switch", "A", out_dir=tmp_path / "x").cert_path.read_bytes()  # A's name, new key
    cases = [((out / "B" / CERT_FILE).read_bytes(), "not a switch certificate of cluster A"),
             (worker, "not a switch certificate of cluster A"),
             (foreign, "another key")]
    before = (cfg.parent / CERT_FILE).read_bytes()
    for n, (pem, says) in enumerate(cases):
        upd = write_update(ca, spec, a, tmp_path / f"A-r{5 + n}.tar.gz", 5 + n, {CERT_FILE: pem})
        with pytest.raises(UpdateError, match=says) as err:
            apply_update(cfg, upd)
        assert err.value.reason == "other_site" and "\n" not in str(err.value)
    assert (cfg.parent / CERT_FILE).read_bytes() == before
    # a worker certificate likewise: B's worker, A's switch, A's worker with a key A's kit does not hold, a worker
    # the switch does not serve
    mine = (cfg.parent / "workers" / "worker.pem").read_bytes()
    stranger = ca.issue("worker", "worker", "A", out_dir=tmp_path / "y").cert_path.read_bytes()
    ghost = ca.issue("ghost", "worker", "A", out_dir=tmp_path / "z").cert_path.read_bytes()
    worker_cases = [("workers/worker.pem", (out / "B" / "workers" / "worker.pem").read_bytes(),
                     "not worker worker's certificate of cluster A"),
                    ("workers/worker.pem", before, "not worker worker's certificate of cluster A"),
                    ("workers/worker.pem", stranger, "another key"),
                    ("workers/ghost.pem", ghost, "does not serve")]
    for n, (name, pem, says) in enumerate(worker_cases):
        upd = write_update(ca, spec, a, tmp_path / f"A-r{9 + n}.tar.gz", 9 + n, {CERT_FILE: before, name: pem})
        with pytest.raises(UpdateError, match=says) as err:
            apply_update(cfg, upd)
        assert err.value.reason == "other_site" and "\n" not in str(err.value)
    assert (cfg.parent / "workers" / "worker.pem").read_bytes() == mine
    assert not (cfg.parent / "workers" / "ghost.pem").exists()
    # and a certificate swapped in by hand (not the one an applied update signs) stops the kit check
    (cfg.parent / CERT_FILE).write_bytes(foreign)
    with pytest.raises(KitError, match="altered"):
        _check(cfg)
    (cfg.parent / CERT_FILE).write_bytes(before)
    (cfg.parent / "workers" / "worker.pem").write_bytes(stranger)
    with pytest.raises(KitError, match="worker.pem was altered"):
        _check(cfg)


def test_provision_prints_site_relative_paths_and_refuses_add_cluster_without_a_port_for_a_remote_host(tmp_path):
    out = tmp_path / "fed"
    done = subprocess.run([str(BIN / "nebula-admin"), "provision", "--federation", "acme", "--clusters", "A,B",
                           "--out", str(out)], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert "its workers use A/worker.yaml there" in done.stdout and str(out / "A" / "worker") not in done.stdout
    with pytest.raises(FederationError, match="pass --port PORT"):
        add_cluster(out, "C", "10.9.9.9")
    bad = subprocess.run([str(BIN / "nebula-admin"), "provision", "add-cluster", "C", "--host",
                          "gw.example.org", "--out", str(out)], capture_output=True, text=True, cwd=REPO)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "--port" in bad.stderr
    assert yaml.safe_load((out / "federation.yaml").read_text())["clusters"][-1]["name"] == "B"


def test_every_option_of_provision_and_its_actions_has_help_text():
    from security.cli import build_parser

    parser = build_parser()
    prov = next(a for a in parser._subparsers._group_actions[0].choices.items() if a[0] == "provision")[1]
    parsers = [prov, *prov._subparsers._group_actions[0].choices.values()]
    assert {"add-cluster", "remove-cluster", "renew"} <= set(prov._subparsers._group_actions[0].choices)
    for p in parsers:
        for action in p._actions:
            if action.dest != "help" and not isinstance(action, type(prov._subparsers._group_actions[0])):
                assert action.help, f"{p.prog}: {action.option_strings or action.dest} has no help text"


def _printed(command: str, cwd: Path) -> subprocess.CompletedProcess:
    """`command` as printed, in `cwd`, with the environment's programs."""
    argv = shlex.split(command)
    argv[0] = str(BIN / argv[0])
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


def test_the_printed_renewal_commands_run(tmp_path):
    provision("acme", ["A", "B"], tmp_path / "fed")
    site = tmp_path / "siteA"  # A's kit unpacked at its site, as the README's walkthrough does: fed/A there
    (site / "fed").mkdir(parents=True)
    subprocess.run(["tar", "xzf", str(tmp_path / "fed" / "kits" / "A.tar.gz"), "-C", "fed"], check=True, cwd=site)
    idle = _printed(PRINTED[0], tmp_path)
    assert idle.returncode == 0 and "nothing due" in idle.stdout and "nothing written" in idle.stdout, idle
    csr = _printed(PRINTED[1], site)
    assert csr.returncode == 0 and (site / "req.pem").exists() and "spiffe://acme/switch/A/switch" in csr.stdout
    shutil.copy(site / "req.pem", tmp_path / "req.pem")  # (shipped to the admin)
    signed = _printed(PRINTED[2], tmp_path)
    assert signed.returncode == 0, signed.stderr
    assert "cluster A: certificate renewed as serial" in signed.stdout and "peers update for A" in signed.stdout
    said = apply_update(site / "fed" / "A" / "switch.yaml", tmp_path / "fed" / "updates" / "A-r2.tar.gz")
    assert "certificate renewed" in said
    # a CSR for another cluster, or no CLUSTER=: one line, exit 2, nothing written
    for bad, says in (("--csr B=req.pem", "not B's switch"), ("--csr req.pem", "is not CLUSTER=FILE")):
        run = _printed(f"nebula-admin provision renew {bad} --out fed", tmp_path)
        assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1 and says in run.stderr, run
    assert not (tmp_path / "fed" / "updates" / "A-r3.tar.gz").exists()
