"""Real TLS handshakes on loopback: good peers accepted; expired, revoked, foreign-CA, wrong-role peers refused."""
from __future__ import annotations

import contextlib
import datetime as dt
import socket
import ssl
import threading
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization

from security.ca import CertificateAuthority
from security.errors import TLSConfigError
from security.identity import Identity
from security.tls import (PeerRejected, check_peer, client_context, crl_serials, describe_tls_error,
                          server_context)

from .conftest import forge_leaf


def creds(ca: CertificateAuthority, cert: Path, key: Path) -> dict:
    return dict(ca=ca.cert_path, cert=cert, key=key, crl=ca.crl_path)


def outcome(side) -> tuple:
    """Run one side of a connection; map its failure to (kind, reason code)."""
    try:
        return side()
    except ssl.SSLError as exc:
        return ("tls", describe_tls_error(exc))
    except PeerRejected as exc:
        return ("peer", exc.reason_code)
    except OSError as exc:
        return ("os", str(exc))


def handshake(server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext, *, role="switch", cluster="B",
              federation="demo", client_version: ssl.TLSVersion | None = None, plaintext: bool = False) -> dict:
    """Run one server accept + client connect on 127.0.0.1:0; return each side's outcome."""
    result: dict = {}
    lsock = socket.create_server(("127.0.0.1", 0))

    def serve() -> tuple:
        conn, _ = lsock.accept()
        conn.settimeout(10)
        with server_ctx.wrap_socket(conn, server_side=True) as tls:
            ident = check_peer(tls, role=role, cluster=cluster, federation=federation)
            tls.sendall(b"hello")
            return ("ok", ident, tls.version())

    def connect(raw: socket.socket) -> tuple:
        if plaintext:
            raw.sendall(b"GET / HTTP/1.0\r\n\r\n")
            return ("sent", raw.recv(100))
        if client_version is not None:
            client_ctx.minimum_version = client_ctx.maximum_version = client_version
        with client_ctx.wrap_socket(raw) as tls:
            ident = check_peer(tls, role="switch", cluster="A", federation="demo")
            return ("ok", ident, tls.recv(5))

    t = threading.Thread(target=lambda: result.__setitem__("server", outcome(serve)))
    t.start()
    try:
        with socket.create_connection(lsock.getsockname(), timeout=10) as raw:
            result["client"] = outcome(lambda: connect(raw))
    finally:
        t.join(15)
        lsock.close()
    return result


@pytest.fixture
def fed(ca, tmp_path):
    """Switch credentials for clusters A (server) and B (client), plus a worker of B."""
    a = ca.issue("switch", "switch", "A", ips=["127.0.0.1"], out_dir=tmp_path / "A")
    b = ca.issue("switch", "switch", "B", ips=["127.0.0.1"], out_dir=tmp_path / "B")
    w = ca.issue("worker", "worker", "B", out_dir=tmp_path / "B")
    return {"a": a, "b": b, "w": w}


def test_good_peers_complete_mutual_tls_and_see_each_others_identity(ca, fed):
    srv = server_context(**creds(ca, fed["a"].cert_path, fed["a"].key_path))
    cli = client_context(**creds(ca, fed["b"].cert_path, fed["b"].key_path))
    res = handshake(srv, cli)
    assert res["server"][0] == "ok" and res["server"][1] == Identity("demo", "switch", "B", "switch")
    assert res["server"][2] == "TLSv1.3"
    assert res["client"] == ("ok", Identity("demo", "switch", "A", "switch"), b"hello")
    res12 = handshake(srv, client_context(**creds(ca, fed["b"].cert_path, fed["b"].key_path)),
                      client_version=ssl.TLSVersion.TLSv1_2)
    assert res12["server"][0] == "ok" and res12["server"][2] == "TLSv1.2"


def test_revoked_client_certificate_is_refused_and_live_recheck_sees_it(ca, fed):
    ca.revoke(fed["b"].serial, "key_compromise")
    srv = server_context(**creds(ca, fed["a"].cert_path, fed["a"].key_path))
    cli = client_context(**creds(ca, fed["b"].cert_path, fed["b"].key_path))
    res = handshake(srv, cli)
    assert res["server"] == ("tls", "revoked")
    assert fed["b"].serial in crl_serials(ca.crl_path) and fed["a"].serial not in crl_serials(ca.crl_path)


def test_session_recheck_with_crl_serials_rejects_revoked_peer(ca, fed, tmp_path):
    srv = server_context(**creds(ca, fed["a"].cert_path, fed["a"].key_path))
    cli = client_context(**creds(ca, fed["b"].cert_path, fed["b"].key_path))
    revoked_later: dict = {}
    lsock = socket.create_server(("127.0.0.1", 0))

    def serve():
        conn, _ = lsock.accept()
        with srv.wrap_socket(conn, server_side=True) as tls:
            check_peer(tls, role="switch", cluster="B", federation="demo")
            ca.revoke(fed["b"].serial)  # revoked while the session is up: the reloaded CRL must catch it
            try:
                check_peer(tls, role="switch", cluster="B", federation="demo", revoked=crl_serials(ca.crl_path))
            except PeerRejected as exc:
                revoked_later["code"] = exc.reason_code
            tls.sendall(b"x")

    t = threading.Thread(target=serve)
    t.start()
    with socket.create_connection(lsock.getsockname(), timeout=10) as raw, cli.wrap_socket(raw) as tls:
        tls.recv(1)
    t.join(10)
    lsock.close()
    assert revoked_later == {"code": "revoked"}


def test_expired_certificate_is_refused(ca, fed, tmp_path):
    now = dt.datetime.now(dt.timezone.utc)
    cert, key = forge_leaf(ca, tmp_path / "old", "spiffe://demo/switch/B/switch",
                           not_before=now - dt.timedelta(days=40), not_after=now - dt.timedelta(days=10))
    srv = server_context(**creds(ca, fed["a"].cert_path, fed["a"].key_path))
    res = handshake(srv, client_context(**creds(ca, cert, key)))
    assert res["server"] == ("tls", "expired")
    # and a server presenting an expired certificate is refused by the client
    res = handshake(server_context(**creds(ca, cert, key)),
                    client_context(**creds(ca, fed["b"].cert_path, fed["b"].key_path)))
    assert res["client"] == ("tls", "expired")


def test_certificate_from_another_ca_is_refused(ca, fed, tmp_path):
    other = CertificateAuthority.init(tmp_path / "other", "demo")
    intruder = other.issue("switch", "switch", "B", out_dir=tmp_path / "intruder")
    srv = server_context(**creds(ca, fed["a"].cert_path, fed["a"].key_path))
    res = handshake(srv, client_context(ca=other.cert_path, cert=intruder.cert_path, key=intruder.key_path,
                                        crl=other.crl_path))
    assert res["server"] == ("tls", "unknown_ca")
    assert res["client"][0] == "tls" and res["client"][1] == "unknown_ca"


def test_wrong_role_cluster_and_federation_are_rejected_by_check_peer(ca, fed, tmp_path):
    srv = server_context(**creds(ca, fed["a"].cert_path, fed["a"].key_path))
    worker_cli = client_context(**creds(ca, fed["w"].cert_path, fed["w"].key_path))
    assert handshake(srv, worker_cli)["server"] == ("peer", "wrong_role")
    b_cli = client_context(**creds(ca, fed["b"].cert_path, fed["b"].key_path))
    assert handshake(srv, b_cli, cluster="C")["server"] == ("peer", "wrong_cluster")
    assert handshake(srv, b_cli, federation="other")["server"] == ("peer", "wrong_federation")
    # a client-only (worker) certificate cannot serve: the client refuses it during the handshake
    res = handshake(server_context(**creds(ca, fed["w"].cert_path, fed["w"].key_path)), b_cli)
    assert res["client"] == ("tls", "bad_certificate")


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_missing_client_certificate_old_protocols_and_plaintext_are_refused(ca, fed):
    srv = server_context(**creds(ca, fed["a"].cert_path, fed["a"].key_path))
    anon = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    anon.check_hostname = False
    anon.load_verify_locations(cafile=str(ca.cert_path))
    res = handshake(srv, anon)
    assert res["server"] == ("tls", "no_certificate")
    old = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    old.check_hostname = False
    old.verify_mode = ssl.CERT_NONE
    with contextlib.suppress(ValueError, ssl.SSLError):  # builds without TLS 1.1 refuse even to configure it
        old.minimum_version = old.maximum_version = ssl.TLSVersion.TLSv1_1
        old.set_ciphers("ALL:@SECLEVEL=0")
    res = handshake(srv, old)
    assert res["server"] == ("tls", "protocol_version")
    assert handshake(srv, anon, plaintext=True)["server"] == ("tls", "plaintext")


def test_context_building_fails_closed_with_named_files(ca, fed, tmp_path):
    a = fed["a"]
    with pytest.raises(TLSConfigError, match="CRL .*missing.pem does not exist"):
        server_context(ca.cert_path, a.cert_path, a.key_path, tmp_path / "missing.pem")
    other = CertificateAuthority.init(tmp_path / "other", "demo")
    with pytest.raises(TLSConfigError, match="is not signed by the CA in use"):
        server_context(ca.cert_path, a.cert_path, a.key_path, other.crl_path)
    with pytest.raises(TLSConfigError, match="key that does not match"):
        server_context(ca.cert_path, a.cert_path, fed["b"].key_path, ca.crl_path)
    now = dt.datetime.now(dt.timezone.utc)
    stale = tmp_path / "stale.pem"
    stale.write_bytes(x509.CertificateRevocationListBuilder().issuer_name(ca.cert.subject)
                      .last_update(now - dt.timedelta(days=9)).next_update(now - dt.timedelta(days=2))
                      .sign(ca.key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))
    with pytest.raises(TLSConfigError, match="stale.pem expired at"):
        client_context(ca.cert_path, a.cert_path, a.key_path, stale)
    enc = ca.issue("sw2", "switch", "A", out_dir=tmp_path / "enc", key_passphrase="pw")
    with pytest.raises(TLSConfigError, match="wrong passphrase"):
        server_context(ca.cert_path, enc.cert_path, enc.key_path, ca.crl_path, passphrase="nope")
    assert isinstance(server_context(ca.cert_path, enc.cert_path, enc.key_path, ca.crl_path, passphrase="pw"),
                      ssl.SSLContext)


def test_describe_tls_error_maps_verify_codes():
    exc = ssl.SSLCertVerificationError(1, "x")
    for code, reason in ((10, "expired"), (23, "revoked"), (20, "unknown_ca"), (26, "bad_certificate")):
        exc.verify_code = code
        assert describe_tls_error(exc) == reason
    assert describe_tls_error(ConnectionResetError()) == "handshake_failed"
