"""Fail-closed start: `nebula-switch serve` refuses its own bad certificate or exposed key files, naming the fix."""
from __future__ import annotations

import datetime as dt
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509

from security.ca import CertificateAuthority
from security.errors import TLSConfigError
from security.preflight import check_key_file, private_key_files
from security.provision import provision
from security.tls import check_own_identity
from tests.security.conftest import forge_leaf

NOW = dt.datetime.now(dt.timezone.utc)


@pytest.fixture
def fed(tmp_path):
    """A provisioned federation A, B; returns (CA, A's directory)."""
    provision("fed", ["A", "B"], tmp_path / "fed")
    return CertificateAuthority.open(tmp_path / "fed" / "ca"), tmp_path / "fed" / "A"


def serve(cluster_dir: Path) -> subprocess.CompletedProcess:
    """Run `nebula-switch serve` on the cluster's switch.yaml; it must exit on its own."""
    return subprocess.run([sys.executable, "-m", "switch_server.cli", "serve", "--config",
                           str(cluster_dir / "switch.yaml")], capture_output=True, text=True, timeout=60)


def install(cluster_dir: Path, cert: Path, key: Path) -> None:
    """Put a certificate and key in place of the switch's own (key private, as provisioning leaves it)."""
    shutil.copy(cert, cluster_dir / "switch.pem")
    shutil.copy(key, cluster_dir / "switch.key")
    os.chmod(cluster_dir / "switch.key", 0o600)


def _forged(ca, tmp_path, uri, not_before, not_after):
    return forge_leaf(ca, tmp_path / "forged", uri, not_before=not_before, not_after=not_after)


BAD_CERTS = {
    "expired": (lambda ca, t: _forged(ca, t, "spiffe://fed/switch/A/switch", NOW - dt.timedelta(days=2),
                                      NOW - dt.timedelta(days=1)), "expired at"),
    "not_yet_valid": (lambda ca, t: _forged(ca, t, "spiffe://fed/switch/A/switch", NOW + dt.timedelta(days=1),
                                            NOW + dt.timedelta(days=2)), "is not valid before"),
    "role_worker": (lambda ca, t: _issued(ca.issue("switch", "worker", "A", out_dir=t / "w")),
                    "of role 'worker', but this process serves role 'switch'"),
    "other_cluster": (lambda ca, t: _issued(ca.issue("switch", "switch", "B", out_dir=t / "b")),
                      "of cluster 'B', but this process serves cluster 'A'"),
    "foreign_ca": (lambda ca, t: _issued(CertificateAuthority.init(t / "other-ca", "fed")
                                         .issue("switch", "switch", "A", out_dir=t / "o")),
                   "is not issued by the CA"),
}


def _issued(issued):
    return issued.cert_path, issued.key_path


@pytest.mark.parametrize("case", sorted(BAD_CERTS))
def test_switch_refuses_to_start_with_a_bad_own_certificate(fed, tmp_path, case):
    ca, a = fed
    make, message = BAD_CERTS[case]
    install(a, *make(ca, tmp_path))
    r = serve(a)
    assert r.returncode == 2 and "listening" not in r.stdout
    assert message in r.stderr and str(a / "switch.pem") in r.stderr, r.stderr


def test_switch_refuses_to_start_with_its_certificate_revoked(fed):
    ca, a = fed
    serial = x509.load_pem_x509_certificate((a / "switch.pem").read_bytes()).serial_number
    ca.revoke(serial, "key_compromise")
    ca.write_crl()
    r = serve(a)
    assert r.returncode == 2 and f"serial {serial:x}) is revoked in the CRL" in r.stderr, r.stderr


@pytest.mark.parametrize("name", ["switch.key", "audit_signing.key", "switch_curve.key_secret",
                                  "workers/worker.key_secret"])
def test_switch_refuses_key_files_readable_by_others_with_the_chmod_fix(fed, name):
    _, a = fed
    os.chmod(a / name, 0o644)
    r = serve(a)
    assert r.returncode == 2 and "listening" not in r.stdout
    path = (a / name).resolve()
    assert f"has mode 0644: group and others can access it" in r.stderr and f"run `chmod 600 {path}`" in r.stderr, \
        r.stderr
    os.chmod(a / name, 0o600)
    with pytest.raises(TLSConfigError, match="group can access"):
        os.chmod(a / name, 0o640)
        check_key_file(a / name)


def test_provision_writes_every_key_private_and_the_good_switch_passes_its_own_checks(fed):
    ca, a = fed
    root = a.parent
    keys = [p for p in root.rglob("*") if p.is_file() and p.name.endswith((".key", ".key_secret"))]
    assert len(keys) >= 2 * 4 + 2  # per cluster: switch, audit, CURVE, worker CURVE (+ worker TLS); CA and its audit
    for p in keys:
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
    assert {p.name for p in private_key_files(a)} >= {"switch.key", "audit_signing.key", "switch_curve.key_secret",
                                                       "worker.key_secret"}
    ident = check_own_identity(root / "ca" / "ca.pem", a / "switch.pem", root / "ca" / "crl.pem", role="switch",
                               cluster="A", federation="fed")
    assert ident.uri == "spiffe://fed/switch/A/switch"
    with pytest.raises(TLSConfigError, match="of federation 'fed', but this process serves federation 'other'"):
        check_own_identity(root / "ca" / "ca.pem", a / "switch.pem", root / "ca" / "crl.pem", role="switch",
                           cluster="A", federation="other")
