"""Identities, issuance by role, CSR flow, renewal, revocation and CRLs, checked with cryptography and openssl."""
from __future__ import annotations

import datetime as dt
import os
import stat
import subprocess
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from security.ca import CertificateAuthority, make_csr, parse_serial
from security.audit import read_records
from security.audit_verify import verify_log
from security.errors import CAError, IdentityError
from security.identity import Identity, identity_of

OPENSSL = "/usr/bin/openssl"


def openssl_verify(ca: CertificateAuthority, cert: Path) -> subprocess.CompletedProcess:
    return subprocess.run([OPENSSL, "verify", "-crl_check", "-CAfile", str(ca.cert_path), "-CRLfile",
                           str(ca.crl_path), str(cert)], capture_output=True, text=True)


def load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_identity_uri_round_trip_and_errors():
    ident = Identity("demo", "switch", "A", "switch")
    assert ident.uri == "spiffe://demo/switch/A/switch"
    assert Identity.parse(ident.uri) == ident
    admin = Identity("demo", "admin", None, "alice")
    assert admin.uri == "spiffe://demo/admin/-/alice" and Identity.parse(admin.uri).cluster is None
    with pytest.raises(IdentityError, match="role 'root' is unknown"):
        Identity("demo", "root", "A", "x")
    with pytest.raises(IdentityError, match="needs a cluster"):
        Identity("demo", "worker", None, "w")
    with pytest.raises(IdentityError, match="spiffe://<federation>"):
        Identity.parse("spiffe://demo/switch/A")
    with pytest.raises(IdentityError, match="not a valid name"):
        Identity("demo", "user", None, "../etc")


def test_issue_by_role_sets_identity_usages_lifetime_and_private_files(ca, tmp_path):
    out = tmp_path / "out"
    sw = ca.issue("switch", "switch", "A", ips=["127.0.0.1"], out_dir=out)
    wk = ca.issue("w0", "worker", "A", out_dir=out)
    ad = ca.issue("alice", "admin", out_dir=out)
    c_sw, c_wk, c_ad = load(sw.cert_path), load(wk.cert_path), load(ad.cert_path)
    assert identity_of(c_sw) == Identity("demo", "switch", "A", "switch")
    assert identity_of(c_ad) == Identity("demo", "admin", None, "alice")
    eku = lambda c: set(c.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)  # noqa: E731
    assert eku(c_sw) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    assert eku(c_wk) == {ExtendedKeyUsageOID.CLIENT_AUTH}
    san = c_sw.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    assert [str(i) for i in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    life = lambda c: c.not_valid_after_utc - c.not_valid_before_utc  # noqa: E731
    assert dt.timedelta(days=30) <= life(c_wk) <= dt.timedelta(days=30, minutes=6)
    assert dt.timedelta(days=1) <= life(c_ad) <= dt.timedelta(days=1, minutes=6)
    assert isinstance(c_sw.public_key(), ec.EllipticCurvePublicKey) and c_sw.public_key().curve.name == "secp256r1"
    assert len({sw.serial, wk.serial, ad.serial}) == 3 and min(sw.serial, wk.serial, ad.serial) > 2**64
    for p in (sw.key_path, wk.cert_path, ca.key_path):
        assert stat.S_IMODE(os.stat(p).st_mode) == 0o600
    assert [r.serial for r in ca.list()] == [sw.serial, wk.serial, ad.serial]
    assert ca.issue("u", "user", days=3, out_dir=out) and \
        load(out / "u.pem").not_valid_after_utc - load(out / "u.pem").not_valid_before_utc < dt.timedelta(days=4)


def test_openssl_accepts_good_and_rejects_revoked_certificates(ca, tmp_path):
    good = ca.issue("switch", "switch", "A", out_dir=tmp_path / "A")
    bad = ca.issue("switch", "switch", "B", out_dir=tmp_path / "B")
    ca.revoke(bad.serial, "key_compromise")
    ok = openssl_verify(ca, good.cert_path)
    assert ok.returncode == 0 and ok.stdout.strip().endswith(": OK"), ok.stderr
    rej = openssl_verify(ca, bad.cert_path)
    assert rej.returncode != 0 and "certificate revoked" in rej.stderr
    crl = x509.load_pem_x509_crl(ca.crl_path.read_bytes())
    entry = crl.get_revoked_certificate_by_serial_number(bad.serial)
    assert entry is not None and crl.get_revoked_certificate_by_serial_number(good.serial) is None
    assert entry.extensions.get_extension_for_class(x509.CRLReason).value.reason == x509.ReasonFlags.key_compromise
    assert crl.next_update_utc > dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=6)
    statuses = {r.serial: r.status for r in ca.list()}
    assert statuses == {good.serial: "valid", bad.serial: "revoked"}
    # an exported CRL (the `crl` command) carries the same revocation
    exported = ca.write_crl(tmp_path / "export.pem", days=2)
    assert x509.load_pem_x509_crl(exported.read_bytes()).get_revoked_certificate_by_serial_number(bad.serial)


def test_csr_flow_keeps_key_on_host_and_renew_keeps_identity(ca, tmp_path):
    host = tmp_path / "host"
    csr, key = make_csr("w7", host)
    cert_path = ca.sign_csr(csr, "worker", "B", days=5)
    cert = load(cert_path)
    assert identity_of(cert) == Identity("demo", "worker", "B", "w7")
    assert {p.name for p in ca.dir.rglob("*.key")} == {"ca.key", "audit_signing.key"}  # w7.key never reached the CA
    assert openssl_verify(ca, cert_path).returncode == 0
    renewed = ca.renew(cert.serial_number, days=10, out=host / "w7-new.pem")
    new = load(renewed.cert_path)
    assert new.serial_number != cert.serial_number and identity_of(new) == identity_of(cert)
    assert new.public_key().public_numbers() == cert.public_key().public_numbers()
    assert openssl_verify(ca, renewed.cert_path).returncode == 0
    ca.renew(renewed.serial, revoke_old=True)
    assert {r.serial: r.status for r in ca.list()}[renewed.serial] == "revoked"
    tampered = host / "bad.csr"
    tampered.write_bytes(b"-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n")
    with pytest.raises(CAError, match="bad.csr is not a valid PEM certificate request"):
        ca.sign_csr(tampered, "worker", "B")
    with pytest.raises(CAError, match="needs a cluster"):
        ca.sign_csr(csr, "worker", None)


def test_ca_errors_name_the_problem_and_change_nothing(ca, tmp_path):
    with pytest.raises(CAError, match="already holds a CA"):
        CertificateAuthority.init(ca.dir, "demo")
    with pytest.raises(CAError, match="does not exist; create it with"):
        CertificateAuthority.open(tmp_path / "nope")
    with pytest.raises(CAError, match="was not issued by this CA"):
        ca.revoke(0xDEADBEEF)
    issued = ca.issue("w", "worker", "A", out_dir=tmp_path / "w")
    ca.revoke(issued.serial)
    with pytest.raises(CAError, match="already revoked"):
        ca.revoke(issued.serial)
    with pytest.raises(CAError, match="is revoked; issue a new certificate"):
        ca.renew(issued.serial)
    with pytest.raises(CAError, match="revocation reason 'oops' is unknown"):
        ca.revoke(ca.list()[0].serial, "oops")
    with pytest.raises(CAError, match="not a hex number"):
        parse_serial("xyz")
    with pytest.raises(CAError, match="days=0 must be a positive"):
        ca.issue("w2", "worker", "A", days=0, out_dir=tmp_path / "w2")
    assert not (tmp_path / "w2").exists()


def test_encrypted_ca_key_requires_the_right_passphrase(tmp_path):
    CertificateAuthority.init(tmp_path / "ca", "demo", passphrase="s3cret")
    assert b"ENCRYPTED" in (tmp_path / "ca" / "ca.key").read_bytes()
    before = (tmp_path / "ca" / "index.db").read_bytes()
    with pytest.raises(CAError, match="wrong passphrase for CA key"):
        CertificateAuthority.open(tmp_path / "ca", "wrong").issue("w", "worker", "A", out_dir=tmp_path / "w")
    with pytest.raises(CAError, match="is encrypted; supply its passphrase"):
        CertificateAuthority.open(tmp_path / "ca").issue("w", "worker", "A", out_dir=tmp_path / "w")
    assert not (tmp_path / "w").exists() and (tmp_path / "ca" / "index.db").read_bytes() == before
    issued = CertificateAuthority.open(tmp_path / "ca", "s3cret").issue("w", "worker", "A", out_dir=tmp_path / "w")
    assert issued.cert_path.exists()


def test_every_ca_operation_is_an_audit_record(ca, tmp_path):
    issued = ca.issue("w", "worker", "A", out_dir=tmp_path)
    ca.revoke(issued.serial, "superseded")
    ca.write_crl()
    actions = [r["action"] for r in read_records(ca.audit_path) if r["action"] != "audit.checkpoint"]
    assert actions == ["ca.init", "cert.issue", "cert.revoke", "crl.write"]
    assert verify_log(ca.audit_path).ok


def test_malformed_or_mismatched_ca_files_are_named(tmp_path):
    ca = CertificateAuthority.init(tmp_path / "ca", "demo")
    other = CertificateAuthority.init(tmp_path / "other", "demo")
    good_pem = ca.cert_path.read_bytes()
    ca.cert_path.write_bytes(b"not a certificate")
    with pytest.raises(CAError, match=r"CA certificate .*ca\.pem is not a valid PEM certificate"):
        CertificateAuthority.open(ca.dir)
    ca.cert_path.write_bytes(good_pem)
    label = b"PRIVATE KEY"  # PEM armour around bytes that are no key at all
    ca.key_path.write_bytes(b"-----BEGIN " + label + b"-----\ngarbage\n-----END " + label + b"-----\n")
    with pytest.raises(CAError, match=r"CA key .*ca\.key is not a valid PEM private key"):
        CertificateAuthority.open(ca.dir).write_crl()
    ca.key_path.write_bytes(other.key_path.read_bytes())
    with pytest.raises(CAError, match="does not belong to"):
        CertificateAuthority.open(ca.dir).issue("w", "worker", "A", out_dir=tmp_path / "w")
    (ca.dir / "index.db").unlink()
    with pytest.raises(CAError, match="lacks index.db"):
        CertificateAuthority.open(ca.dir)
