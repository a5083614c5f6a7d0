"""Workers on other hosts over the switch's TLS endpoint (`local.tls_endpoint`, `transport: tls`, or `auto` away
from the switch's host): mutual TLS with the kit's certificates, then the worker's key and derived password, against
real switches. A certificate of the wrong cluster or role, one that does not match the key, no certificate, a
revoked one, or a switch that is not the worker's own is refused, audited, and the switch serves the rest."""
from __future__ import annotations

import re
import socket
import ssl
from pathlib import Path

import pytest
import yaml

from nebula.channel import Endpoint, SwitchRefused
from nebula.config.worker import load_worker_config, local_endpoint
from nebula.wire import FrameType, decode_frame, encode_frame
from nebula.wire.stream import AUTH, AUTH_NO, AUTH_OK, MessageParser, frame_parts
from security.ca import CertificateAuthority
from security.tls import client_context
from testbed.federation import wait_audit
from tests.switch.conftest import exchange, worker_yaml, worker_yaml_as
from tests.switch.test_stream_workers import _credentials


def _refusal(worker_file: str) -> str:
    """Why the switch (or the worker, of the switch) refuses a connection with `worker_file`."""
    with pytest.raises(SwitchRefused) as err:
        Endpoint.connect(worker_file, job="j", rank=0, timeout_s=20).close()
    return str(err.value)


def _tls_yaml(fed, cluster: str, out: Path, **changes) -> str:
    return worker_yaml_as(fed, cluster, out, transport="tls", **changes)


def test_workers_on_other_hosts_take_mutual_tls(two_switches, tmp_path):
    """Workers whose file names the switch's TLS endpoint and no same-host path use it (`auto`), carry messages of
    every size both ways, and are audited as accepted over TLS at their address."""
    fed, a, _b = two_switches
    ya = worker_yaml_as(fed, "A", tmp_path / "a.yaml", ipc_endpoint="")  # (as on a host of its own: no IPC)
    assert local_endpoint(load_worker_config(ya))[1] == "tls"
    yb = _tls_yaml(fed, "B", tmp_path / "b.yaml")
    assert exchange(ya, yb) == ("tls", "tls")
    rec = wait_audit(a, lambda r: r["action"] == "worker_accepted")
    assert rec["detail"]["transport"] == "tls" and rec["target"].startswith("tls:127.0.0.1:")


def test_a_certificate_of_another_cluster_is_refused_audited(two_switches, tmp_path):
    """B's worker certificate on A's TLS endpoint (with A's switch pinned by the file): the switch refuses it as
    of the wrong cluster, the worker says which file to fix, and A goes on serving its own workers."""
    fed, a, _b = two_switches
    b_tls = yaml.safe_load(Path(_tls_yaml(fed, "B", tmp_path / "b.yaml")).read_text())["tls"]
    bad = _tls_yaml(fed, "A", tmp_path / "bad.yaml", tls=b_tls)
    assert re.search(r"TLS with the switch .* failed: .*check tls in worker\.yaml", _refusal(bad))
    rec = wait_audit(a, lambda r: r["action"] == "worker_rejected")
    assert rec["detail"]["reason"] == "wrong_cluster" and rec["target"].startswith("tls:127.0.0.1:")
    assert exchange(_tls_yaml(fed, "A", tmp_path / "a.yaml"), _tls_yaml(fed, "B", tmp_path / "b2.yaml")) == (
        "tls", "tls")


def test_a_switch_that_is_not_the_workers_own_is_refused_by_the_worker(two_switches, tmp_path):
    """A's worker pointed at B's TLS endpoint: B's certificate verifies against the CA but names cluster B, so the
    worker refuses it before sending its key or password."""
    fed, _a, b = two_switches
    b_endpoint = yaml.safe_load(Path(worker_yaml(fed, "B")).read_text())["tls_endpoint"]
    wrong = _tls_yaml(fed, "A", tmp_path / "wrong.yaml", tls_endpoint=b_endpoint)
    assert re.search(r"the switch is not this cluster's: .* cluster 'B', expected 'A'", _refusal(wrong))
    # (B, for its part, refuses the certificate of cluster A's worker; no key or password ever reached it)
    seen = [r for r in b.audit() if r["action"] in ("worker_accepted", "worker_rejected")]
    assert seen and {r["detail"]["reason"] for r in seen} == {"wrong_cluster"}


def _raw_tls(fed, cluster: str, cert: Path | None, key: Path | None) -> ssl.SSLSocket:
    doc = yaml.safe_load(Path(worker_yaml(fed, cluster)).read_text())
    base = Path(worker_yaml(fed, cluster)).parent
    if cert is None:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    else:
        ctx = client_context(base / "ca.pem", cert, key, base / "crl.pem")
    host, _, port = doc["tls_endpoint"].rpartition(":")
    s = ctx.wrap_socket(socket.create_connection((host, int(port)), timeout=10))
    return s


def _ask(s: ssl.SSLSocket, parts: list[bytes]) -> list[bytes] | None:
    """The switch's answer to `parts`, or None when it ends the connection instead."""
    parser = MessageParser(1 << 20)
    try:
        s.sendall(b"".join(bytes(p) for p in frame_parts(parts)))
    except (ssl.SSLError, ConnectionResetError, BrokenPipeError):
        return None
    while True:
        try:
            n = s.recv_into(parser.buffer())
        except (ssl.SSLError, ConnectionResetError):
            return None
        if n == 0:
            return None
        msgs = parser.taken(n)
        if msgs:
            return [bytes(p) for p in msgs[0]]


def test_no_certificate_and_another_workers_key_are_refused_audited(two_switches, tmp_path):
    """A client with no certificate never gets past TLS; a valid certificate of worker `other` presenting worker
    `worker`'s key and password is answered AUTH_NO; each refusal is audited, and the real worker goes on."""
    fed, a, _b = two_switches
    s = _raw_tls(fed, "A", None, None)
    try:
        assert _ask(s, [AUTH, *_credentials(fed, "A")]) is None
    finally:
        s.close()
    assert wait_audit(a, lambda r: r["action"] == "worker_rejected")["detail"]["reason"].startswith("tls_")
    other = CertificateAuthority.open(fed["ca"]).issue("other", "worker", "A", 1, out_dir=tmp_path, stem="other")
    s = _raw_tls(fed, "A", other.cert_path, other.key_path)
    try:
        answer = _ask(s, [AUTH, *_credentials(fed, "A")])
        assert answer is not None and answer[0] == AUTH_NO
    finally:
        s.close()
    rec = wait_audit(a, lambda r: r["detail"].get("reason") == "certificate_key_mismatch")
    assert rec["actor"] == "worker:other" and rec["detail"]["key_of"] == "worker"
    base = Path(worker_yaml(fed, "A")).parent
    s = _raw_tls(fed, "A", base / "workers" / "worker.pem", base / "workers" / "worker.key")
    try:
        assert _ask(s, [AUTH, *_credentials(fed, "A")]) == [AUTH_OK, b"worker/nebula"]
        # a worker on another host asking for a shared-memory arena is welcomed without one
        hello = {"job": "j", "rank": 3, "account": "nebula", "name": "worker", "shm": 0}
        welcome = decode_frame(_ask(s, [encode_frame(FrameType.HELLO, hello)])[0], b"")
        assert welcome.type == FrameType.WELCOME and "shm" not in welcome.meta
    finally:
        s.close()


def _closed(s: ssl.SSLSocket) -> bool:
    """Whether the switch ended the connection (an abort may reach us as a reset)."""
    s.settimeout(30)
    try:
        return s.recv(1) == b""
    except (ssl.SSLError, ConnectionResetError):
        return True


@pytest.mark.slow
def test_a_revoked_worker_certificate_is_cut_live_and_refused_after(two_switches, tmp_path):
    """Revoking a connected worker's certificate ends its connection once the switch reads the new CRL (audited
    as live), and its next handshake is refused."""
    from cryptography import x509

    fed, a, _b = two_switches
    ya = _tls_yaml(fed, "A", tmp_path / "a.yaml")
    cert = Path(yaml.safe_load(Path(ya).read_text())["tls"]["cert"])
    base = Path(worker_yaml(fed, "A")).parent
    s = _raw_tls(fed, "A", cert, base / "workers" / "worker.key")
    try:
        assert _ask(s, [AUTH, *_credentials(fed, "A")]) == [AUTH_OK, b"worker/nebula"]
        serial = x509.load_pem_x509_certificate(cert.read_bytes()).serial_number
        CertificateAuthority.open(fed["ca"]).revoke(serial, "key_compromise")
        rec = wait_audit(a, lambda r: r["action"] == "worker_rejected" and r["detail"].get("live"), timeout_s=60)
        assert rec["detail"]["reason"] == "revoked" and rec["actor"] == "worker:worker"
        assert _closed(s)
    finally:
        s.close()
    assert "TLS with the switch" in _refusal(ya)


def test_a_worker_certificate_renewed_by_provision_renew_is_taken_by_the_running_switch(two_switches, tmp_path):
    """`nebula-admin provision renew` re-signs each worker's certificate for the key it holds; a worker connecting
    with the renewed one is accepted over TLS by the switch already running (no restart), and carries messages."""
    from cryptography import x509

    from security.provision import renew

    fed, a, _b = two_switches
    pem = Path(fed["clusters"]["A"]["dir"]) / "workers" / "worker.pem"
    before = x509.load_pem_x509_certificate(pem.read_bytes())
    got = renew(Path(fed["clusters"]["A"]["dir"]).parent, renew_all=True)
    after = x509.load_pem_x509_certificate(pem.read_bytes())
    assert f"{after.serial_number:x}" == got["renewed_workers"]["A"]["worker"]["serial"]
    assert after.serial_number != before.serial_number and after.public_key() == before.public_key()
    assert after.not_valid_after_utc >= before.not_valid_after_utc
    ya, yb = _tls_yaml(fed, "A", tmp_path / "a.yaml"), _tls_yaml(fed, "B", tmp_path / "b.yaml")
    assert exchange(ya, yb) == ("tls", "tls")
    wait_audit(a, lambda r: r["action"] == "worker_accepted" and r["detail"].get("transport") == "tls")
