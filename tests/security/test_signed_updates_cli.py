"""`nebula-switch reload --update` and `serve` against real switch processes: the forged update that re-added a
removed cluster is refused (exit 2, one line, audited) while the admin's signed update is taken live, and a switch
refuses to start from a kit whose files were altered."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import yaml
from cryptography import x509

from security.ca import CertificateAuthority
from security.provision import provision, remove_cluster
from security.signing import Statement, crl_number, key_fingerprint, sha256_hex, sign_statement
from testbed.federation import start_switch, wait_audit
from testbed.updates import link_up, pack, switch_cli, unpack


def _one_line_refusal(run: subprocess.CompletedProcess, says: str) -> None:
    assert run.returncode == 2 and run.stderr.count("\n") == 1 and says in run.stderr, (run.returncode, run.stderr)
    assert "Traceback" not in run.stderr + run.stdout


def test_a_forged_update_is_refused_live_and_the_admins_update_is_taken(procs, tmp_path):
    out = tmp_path / "fed"
    provision("acme", ["A", "B", "C"], out)
    cfg = unpack(out / "kits" / "A.tar.gz", tmp_path / "siteA") / "A" / "switch.yaml"
    old_crl = (cfg.parent / "crl.pem").read_bytes()
    a = start_switch(procs, cfg)
    start_switch(procs, out / "B" / "switch.yaml")
    # C from its own unpacked kit: the admin's CRL (which revokes C below) is not C's until C is sent an update
    start_switch(procs, unpack(out / "kits" / "C.tar.gz", tmp_path / "siteC") / "C" / "switch.yaml")
    link_up(cfg, "C", True)

    real = Path(remove_cluster(out, "C")["updates"]["A"])
    peers = yaml.safe_load(cfg.read_text())["peers"]
    forged = pack(tmp_path / "A-r99.tar.gz", {
        "update.yaml": yaml.safe_dump({"federation": "acme", "cluster": "A", "revision": 99, "peers": peers}).encode(),
        "crl.pem": old_crl})
    refused = switch_cli("reload", "--config", str(cfg), "--update", str(forged))
    _one_line_refusal(refused, "A-r99.tar.gz is not signed")
    rec = wait_audit(a, lambda r: r["action"] == "peers_update" and r["outcome"] == "denied")
    assert rec["target"] == "A-r99.tar.gz" and rec["detail"]["reason"] == "unsigned"
    # a CA-signed update.yaml nested thousands deep: one line too (the signature is checked first, then the parse)
    ca = CertificateAuthority.open(out / "ca")
    bomb = b"federation: acme\ncluster: A\nrevision: 9\npeers: " + b"[" * 3000 + b"]" * 3000 + b"\n"
    crl = ca.crl_path.read_bytes()
    st = Statement("peers_update", "acme", "A", 9, crl_number(x509.load_pem_x509_crl(crl)), ("B",),
                   (("update.yaml", sha256_hex(bomb)), ("crl.pem", sha256_hex(crl))))
    signed_bomb = pack(tmp_path / "bomb.tar.gz", {"update.yaml": bomb, "crl.pem": crl,
                                                   "update.sig": sign_statement(st, ca.cert, ca.key)})
    _one_line_refusal(switch_cli("reload", "--config", str(cfg), "--update", str(signed_bomb)), "nests too deeply")
    link_up(cfg, "C", True)  # (nothing changed)

    taken = switch_cli("reload", "--config", str(cfg), "--update", str(real))
    assert taken.returncode == 0, taken.stderr
    assert "revision 2: peers B" in taken.stdout and "revokes 2 certificate(s)" in taken.stdout
    assert f"switch A (pid {a.proc.pid}) reloaded" in taken.stdout
    link_up(cfg, "C", False)
    ok = wait_audit(a, lambda r: r["action"] == "peers_update" and r["outcome"] == "ok")
    number = crl_number(x509.load_pem_x509_crl((cfg.parent / "crl.pem").read_bytes()))
    assert ok["detail"]["signer"] == key_fingerprint(ca.cert.public_key())
    assert (ok["detail"]["revision"], ok["detail"]["crl_number"], ok["detail"]["previous_revision"]) == (2, number, 1)
    reload = wait_audit(a, lambda r: r["action"] == "reload" and r["outcome"] == "ok")
    assert reload["detail"]["kit"]["revision"] == 2 and reload["detail"]["peers"] == ["B"]
    # the forged one stays refused, and so does the real one a second time
    _one_line_refusal(switch_cli("reload", "--config", str(cfg), "--update", str(forged)), "is not signed")
    _one_line_refusal(switch_cli("reload", "--config", str(cfg), "--update", str(real)),
                      "is revision 2, this kit is at revision 2 already")
    # the switch restarts from its updated kit: the applied update is checked again, and accepted
    assert a.stop() == 0
    a = start_switch(procs, cfg)
    kit = wait_audit(a, lambda r: r["action"] == "kit_verified" and r["detail"]["revision"] == 2)
    assert kit["detail"]["source"] == "applied-update.json (revision 2)"
    assert [r["detail"]["revision"] for r in a.audit() if r["action"] == "kit_verified"] == [1, 2]


def test_serve_refuses_an_altered_kit_in_one_line(procs, tmp_path):
    out = tmp_path / "fed"
    provision("acme", ["A", "B"], out)
    cfg = unpack(out / "kits" / "B.tar.gz", tmp_path / "siteB") / "B" / "switch.yaml"
    cert = cfg.parent / "workers" / "worker.pem"
    good = cert.read_bytes()
    cert.write_bytes(good + b"\n")
    run = switch_cli("serve", "--config", str(cfg))
    _one_line_refusal(run, f"kit file {cert} was altered since the admin signed the kit (kit.sig)")
    audit = [json.loads(line) for line in (cfg.parent / "audit.log").read_text().splitlines()]
    assert any(r["action"] == "switch_start_failed" and "was altered" in r["detail"]["reason"] for r in audit)
    cert.write_bytes(good)
    # a peer the admin never signed, written into switch.yaml by hand
    doc = yaml.safe_load(cfg.read_text())
    cfg.write_text(yaml.safe_dump({**doc, "peers": [*doc["peers"], {"cluster": "Z", "address": "127.0.0.1:9"}]}))
    _one_line_refusal(switch_cli("serve", "--config", str(cfg)), "lists peer Z, which the admin's signed peers")
    cfg.write_text(yaml.safe_dump(doc))
    b = start_switch(procs, cfg)
    assert wait_audit(b, lambda r: r["action"] == "kit_verified")["detail"]["revision"] == 1
    # a kit altered while its switch runs: the reload is refused, the running configuration kept
    readme = cfg.parent / "README.md"
    readme.write_text(readme.read_text() + "\nrun ./evil instead\n")
    run = switch_cli("reload", "--config", str(cfg))
    assert run.returncode == 1 and run.stderr.count("\n") == 1, run.stderr
    assert f"refused the reload and keeps its running configuration: kit file {readme} was altered" in run.stderr


def test_a_site_that_rolls_its_kit_back_is_refused_at_start(procs, tmp_path):
    """A site that took update r2 and then puts back its kit's original files (signed r1: every file checks against
    kit.sig) is refused: the switch's state directory remembers the highest revision and CRL number it ran with."""
    out = tmp_path / "fed"
    provision("acme", ["A", "B", "C"], out)
    site = unpack(out / "kits" / "A.tar.gz", tmp_path / "siteA")
    cfg = site / "A" / "switch.yaml"
    original = {p.relative_to(site): p.read_bytes() for p in (site / "A").rglob("*") if p.is_file()}
    a = start_switch(procs, cfg)
    real = Path(remove_cluster(out, "C")["updates"]["A"])
    assert switch_cli("reload", "--config", str(cfg), "--update", str(real)).returncode == 0
    wait_audit(a, lambda r: r["action"] == "peers_update" and r["outcome"] == "ok")
    assert a.stop() == 0
    (cfg.parent / "applied-update.json").unlink()
    for rel, data in original.items():  # the kit as the admin first sent it: r1, C a peer, the older CRL
        (site / rel).write_bytes(data)
    _one_line_refusal(switch_cli("serve", "--config", str(cfg)), "but this switch already ran with 2")
    audit = [json.loads(line) for line in (cfg.parent / "audit.log").read_text().splitlines()]
    assert any(r["action"] == "switch_start_failed" and "rolled back" in r["detail"]["reason"] for r in audit)
    # the admin's update written into the kit again (it is above the kit's r1): the switch starts, at r2
    from security.updates import apply_update

    apply_update(cfg, real)
    a = start_switch(procs, cfg)
    wait_audit(a, lambda r: r["action"] == "kit_verified" and r["detail"]["revision"] == 2)
    assert [r["detail"]["revision"] for r in a.audit() if r["action"] == "kit_verified"] == [1, 2]
