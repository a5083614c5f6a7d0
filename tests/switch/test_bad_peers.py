"""Every kind of bad TLS peer is refused and audited with its reason while a good session keeps working."""
from __future__ import annotations

import socket
import ssl
import subprocess
import time
import warnings
from pathlib import Path

import pytest

from nebula.channel import Endpoint
from nebula.config import split_host_port
from security.ca import CertificateAuthority
from testbed.federation import start_switch, wait_audit
from tests.switch.conftest import worker_yaml


@pytest.fixture
def bad_certs(federation, tmp_path):
    """Certificates a peer must not get in with, made before the switches start."""
    ca = CertificateAuthority.open(federation["ca"])
    out = tmp_path / "bad"
    certs = {
        "expired": ca.issue("expired-b", "switch", "B", days=1e-5, out_dir=out),
        "revoked": ca.issue("revoked-b", "switch", "B", out_dir=out),
        "wrong_cluster": ca.issue("switch-c", "switch", "C", out_dir=out),
        "wrong_role": ca.issue("worker-b", "worker", "B", out_dir=out),
    }
    ca.revoke(certs["revoked"].serial, "key_compromise")
    other = CertificateAuthority.init(tmp_path / "other-ca", "fed")
    certs["unknown_ca"] = other.issue("switch-b", "switch", "B", out_dir=tmp_path / "other")
    time.sleep(1.0)  # the expired certificate's lifetime (under a second) runs out
    return certs


def _python_client(addr: tuple[str, int], ca: str, cert, *, tls11: bool = False) -> bytes:
    """Connect with Python's ssl; return whatever application data the server sent before closing (must be none)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.load_verify_locations(ca)
    ctx.load_cert_chain(str(cert.cert_path), str(cert.key_path))
    if tls11:
        with warnings.catch_warnings():  # deliberately speaking a deprecated version
            warnings.simplefilter("ignore", DeprecationWarning)
            ctx.minimum_version = ssl.TLSVersion.TLSv1
            ctx.maximum_version = ssl.TLSVersion.TLSv1_1
        ctx.set_ciphers("DEFAULT:@SECLEVEL=0")
    with socket.create_connection(addr, timeout=10) as raw:
        try:
            with ctx.wrap_socket(raw) as s:
                s.sendall(b"NB" + b"\0" * 100)
                return s.recv(65536)
        except (ssl.SSLError, ConnectionError, socket.timeout):
            return b""


def _openssl_client(addr: str, ca: str, cert, *extra: str) -> str:
    r = subprocess.run(
        ["openssl", "s_client", "-connect", addr, "-CAfile", ca, "-cert", str(cert.cert_path),
         "-key", str(cert.key_path), "-ign_eof", *extra],
        input=b"hello\n", capture_output=True, timeout=30,
    )
    return (r.stdout + r.stderr).decode(errors="replace")


def test_bad_peers_refused_with_reason(procs, federation, bad_certs):
    a = start_switch(procs, Path(federation["clusters"]["A"]["switch_yaml"]))
    b = start_switch(procs, Path(federation["clusters"]["B"]["switch_yaml"]))
    ca = str(Path(federation["ca"]) / "ca.pem")
    addr = split_host_port(a.wan)
    with Endpoint.connect(worker_yaml(federation, "A"), job="j", rank=0) as ea, \
            Endpoint.connect(worker_yaml(federation, "B"), job="j", rank=0) as eb:
        tx, rx = ea.channel("B", 0, "good"), eb.channel("A", 0, "good")
        tx.send(b"before")
        assert rx.recv(timeout_s=30) == b"before"

        def rejected(reason: str) -> dict:
            return wait_audit(a, lambda r: r["action"] == "peer_rejected" and r["detail"]["reason"] == reason)

        # plaintext
        with socket.create_connection(addr, timeout=10) as s:
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            try:
                data = s.recv(65536)
            except ConnectionError:
                data = b""
        assert b"HTTP" not in data and b"NB" not in data
        assert rejected("plaintext")["outcome"] == "denied"
        for reason in ("expired", "revoked", "unknown_ca", "wrong_role", "wrong_cluster"):
            assert _python_client(addr, ca, bad_certs[reason]) == b"", reason
            rec = rejected(reason)
            assert rec["detail"]["direction"] == "in"
        good = bad_certs["revoked"]  # any client cert: the version is refused before certificates matter
        assert _python_client(addr, ca, good, tls11=True) == b""
        rejected("protocol_version")
        n_before = len(a.audit())
        # the openssl binary is refused the same way: the connection ends without a byte of data
        for cert, extra in ((bad_certs["unknown_ca"], ()), (bad_certs["expired"], ()), (bad_certs["revoked"], ()),
                            (bad_certs["revoked"], ("-tls1_1", "-cipher", "DEFAULT:@SECLEVEL=0"))):
            out = _openssl_client(a.wan, ca, cert, *extra)
            assert any(sign in out for sign in ("unexpected eof", "alert", "no protocols", "errno=104")), out
            assert "Read BLOCK" not in out and "NB" not in out.split("---")[-1]
        # the switch audits a refusal after the client has gone: wait for the last one rather than read once
        want = {"unknown_ca", "expired", "revoked", "protocol_version"}
        deadline = time.monotonic() + 20
        while True:
            reasons = {r["detail"]["reason"] for r in a.audit()[n_before:] if r["action"] == "peer_rejected"}
            if want <= reasons or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert want <= reasons, reasons
        # the good session never noticed
        tx.send(b"after")
        assert rx.recv(timeout_s=30) == b"after"
    # one accepted session each way for the whole test: the good link was never dropped
    accepted = [r for r in a.audit() if r["action"] == "peer_accepted"]
    assert sorted(r["detail"]["direction"] for r in accepted) == ["in", "out"]
    assert all(r["detail"]["identity"] == "spiffe://fed/switch/B/switch" for r in accepted)
