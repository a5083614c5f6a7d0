"""Hot reload: a revoked live peer is cut (and stays out), limits and routes change on SIGHUP, bad reloads are refused."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from nebula.channel import Endpoint, PeerUnavailable
from security.ca import CertificateAuthority
from testbed.federation import edit_yaml, start_switch, wait_audit
from tests.switch.conftest import worker_yaml


def _serial(pem: Path) -> int:
    from cryptography import x509

    return x509.load_pem_x509_certificate(pem.read_bytes()).serial_number


@pytest.mark.slow
def test_revoked_live_peer_is_cut_and_reload_applies(procs, federation):
    ya = Path(federation["clusters"]["A"]["switch_yaml"])
    yb = Path(federation["clusters"]["B"]["switch_yaml"])
    a, b = start_switch(procs, ya), start_switch(procs, yb)
    with Endpoint.connect(worker_yaml(federation, "A"), job="j", rank=0) as ea, \
            Endpoint.connect(worker_yaml(federation, "B"), job="j", rank=0) as eb:
        tx, rx = ea.channel("B", 0, "c"), eb.channel("A", 0, "c")
        tx.send(b"one")
        assert rx.recv(timeout_s=30) == b"one"

        # SIGHUP with new limits: applied and audited, the session stays up
        edit_yaml(ya, lambda d: d.update(limits={"peer_rate_mbit": 500.0}))
        a.hup()
        rec = wait_audit(a, lambda r: r["action"] == "reload")
        assert rec["outcome"] == "ok"
        tx.send(b"two")
        assert rx.recv(timeout_s=30) == b"two"

        # a broken config on reload is refused; the switch keeps its running configuration
        text = ya.read_text()
        ya.write_text(text + "\nbogus_key: 1\n")
        a.hup()
        rec = wait_audit(a, lambda r: r["action"] == "reload" and r["outcome"] == "error")
        assert "bogus_key" in rec["detail"]["reason"]
        ya.write_text(text)
        tx.send(b"three")
        assert rx.recv(timeout_s=30) == b"three"

        # revoke B's switch certificate: A re-reads the CRL and cuts B's live sessions well within 60 s
        t0 = time.monotonic()
        CertificateAuthority.open(federation["ca"]).revoke(_serial(yb.parent / "switch.pem"), "key_compromise")
        rec = wait_audit(a, lambda r: r["action"] == "peer_rejected" and r["detail"].get("live"), timeout_s=60)
        assert rec["detail"]["reason"] == "revoked" and time.monotonic() - t0 < 60
        assert wait_audit(a, lambda r: r["action"] == "crl_reload")["outcome"] == "ok"
        # B cannot come back: its handshakes are refused as revoked, and A's workers see the peer as unavailable
        wait_audit(a, lambda r: r["action"] == "peer_rejected" and r["detail"]["reason"] == "revoked"
                   and not r["detail"].get("live"), timeout_s=30)
        with pytest.raises(PeerUnavailable):
            tx.send(b"four")
            ea.channel("B", 0, "c").recv(timeout_s=3)
