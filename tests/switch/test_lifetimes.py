"""A federation of two real switches (each run from its kit as unpacked at its site, loopback, port 0) across two
CRL lifetimes: the CRL lives seconds (`ca.crl_days` takes a fraction: a real lifetime that OpenSSL checks against
the real clock, where a faked clock would not reach the handshakes), the admin's `provision renew` sends each site a
fresh CRL (the first time also renewed certificates) that the site applies with `nebula-switch reload --update`, and
the link between the sites never drops while messages flow; new connections are accepted after both first CRLs
expired. Without a renewal, the switch warns once when the CRL enters its margin (log, status, gauge), then refuses
new connections and reloads once it has expired, while the live link goes on."""
from __future__ import annotations

import json
import socket
import ssl
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

from security.federation import parse_federation
from security.provision import provision_spec, renew
from testbed.federation import BIN, start_switch, wait_audit, wait_until

LIFE_S = 20.0  # the CRL's lifetime: long enough for a renewal and two reloads on a busy machine


def _status(cfg: Path) -> dict:
    try:
        return json.loads((cfg.parent / "state" / "status.json").read_text())
    except (OSError, ValueError):
        return {}


def _accepted(switch) -> int:
    """Peer connections the switch accepted (both directions) so far: one more means a link was made again."""
    return sum(1 for r in switch.audit() if r["action"] == "peer_accepted")


def _apply(cfgs: dict[str, Path], updates: dict[str, str]) -> dict[str, str]:
    """Each site applies its update, as its operator would (`nebula-switch reload --update`), at the same time."""
    runs = {c: subprocess.Popen([str(BIN / "nebula-switch"), "reload", "--config", str(cfg), "--update",
                                 updates[c]], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for c, cfg in cfgs.items()}
    said = {c: p.communicate(timeout=60)[0] for c, p in runs.items()}
    for c, p in runs.items():
        assert p.returncode == 0, said[c]
    return said


def _at(iso: str) -> float:
    return time.mktime(time.strptime(iso, "%Y-%m-%dT%H:%M:%SZ")) - time.timezone


class Traffic:
    """B's worker sends numbered messages to A's worker, one at a time, until stopped; when each arrived."""

    def __init__(self, wa: Path, wb: Path) -> None:
        self.arrived: list[float] = []
        self.error: BaseException | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(wa, wb), daemon=True)
        self.thread.start()

    def _run(self, wa: Path, wb: Path) -> None:
        from nebula.channel import Endpoint

        try:
            with Endpoint.connect(str(wa), job="j", rank=0) as ea, Endpoint.connect(str(wb), job="j", rank=0) as eb:
                tx, rx = eb.channel("A", 0, "t"), ea.channel("B", 0, "t")
                n = 0
                while not self.stop.is_set():
                    tx.send(n.to_bytes(4, "big") * 256)
                    assert rx.recv(timeout_s=30) == n.to_bytes(4, "big") * 256  # in order, none lost
                    self.arrived.append(time.time())
                    n += 1
                    self.stop.wait(0.05)
        except BaseException as exc:  # (reported by the test)
            self.error = exc

    def flowing_after(self, t: float, timeout_s: float = 30.0) -> None:
        wait_until(lambda: self.error is not None or (self.arrived and self.arrived[-1] > t), timeout_s,
               "a message after the mark")
        assert self.error is None, repr(self.error)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(60)
        assert self.error is None, repr(self.error)


def _handshake(wan: str, site: Path, *, check_crl: bool = True) -> ssl.SSLSocket:
    """A TLS connection to the switch at `wan` with `site`'s switch certificate (a new peer connection)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.load_verify_locations(str(site / "ca.pem"))
    ctx.load_cert_chain(str(site / "switch.pem"), str(site / "switch.key"))
    host, _, port = wan.rpartition(":")
    raw = socket.create_connection((host, int(port)), timeout=10)
    return ctx.wrap_socket(raw, server_hostname=None)


def test_two_crl_lifetimes_renewed_by_signed_updates_without_a_link_drop_and_refused_without(procs, tmp_path):
    spec = parse_federation({"federation": "life", "ca": {"crl_days": LIFE_S / 86400},
                             "clusters": [{"name": "A", "host": "127.0.0.1", "port": 0},
                                          {"name": "B", "host": "127.0.0.1", "port": 0}]})
    out = tmp_path / "admin"
    provision_spec(spec, out, fresh=True)
    t0 = time.time()
    cfgs = {}
    for c in ("A", "B"):  # each site runs its kit as shipped, apart from the admin's directory
        (tmp_path / f"site{c}").mkdir()
        subprocess.run(["tar", "xzf", str(out / "kits" / f"{c}.tar.gz"), "-C", str(tmp_path / f"site{c}")],
                       check=True)
        cfgs[c] = tmp_path / f"site{c}" / c / "switch.yaml"
    a, b = start_switch(procs, cfgs["A"]), start_switch(procs, cfgs["B"])
    traffic = Traffic(cfgs["A"].parent / "worker.yaml", cfgs["B"].parent / "worker.yaml")  # (from the start)
    try:
        wait_until(lambda: all(_status(cfgs[x]).get("links", {}).get(y, {}).get("up")
                           for x, y in (("A", "B"), ("B", "A"))), 30, "both links up")
        accepted = (_accepted(a), _accepted(b))
        serial = _status(cfgs["A"])["certificate_expires"]

        # round 1: certificates renewed for the sites' own keys and a fresh CRL, as signed updates
        first = renew(out, renew_all=True, crl_margin_days=1)
        assert all("certificate renewed" in said for said in _apply(cfgs, first["updates"]).values())
        crl2_end = _at(first["crl_next_update"])
        wait_until(lambda: _status(cfgs["A"]).get("certificate_expires") != serial, 20, "A's renewed certificate in use")
        traffic.flowing_after(time.time())

        # round 2, with two thirds of the second CRL's life left: the CRL alone is due (margin: three quarters)
        wait_until(lambda: time.time() > crl2_end - 2 * LIFE_S / 3, LIFE_S, "a third of the second CRL's life")
        assert renew(out)["nothing_due"]  # (the default margin, half its life, is not reached yet)
        second = renew(out, crl_margin_days=0.75 * LIFE_S / 86400)
        assert not second["nothing_due"] and second["renewed"] == {}
        _apply(cfgs, second["updates"])
        crl3_end = _at(second["crl_next_update"])
        wait_until(lambda: time.time() > t0 + LIFE_S + 1, LIFE_S + 5, "the first CRL's expiry")
        traffic.flowing_after(t0 + LIFE_S)
        wait_until(lambda: time.time() > crl2_end + 1, LIFE_S, "the second CRL's expiry")
        traffic.flowing_after(crl2_end)
        for c, peer in (("A", "B"), ("B", "A")):
            assert _status(cfgs[c])["links"][peer]["up"]
        assert (_accepted(a), _accepted(b)) == accepted  # no link was made again: none dropped

        # a new peer connection with B's renewed certificate is accepted under the third CRL
        with _handshake(a.wan, cfgs["B"].parent) as s:
            me = "%s:%d" % s.getsockname()[:2]
            wait_audit(a, lambda r: r["action"] == "peer_accepted" and r["detail"].get("address") == me)

        # no renewal now: one warning as the third CRL enters its margin (a third of its life), in the status too
        said = f"expires at {second['crl_next_update']}"
        line = wait_until(lambda: [x for x in a.log.read_text().splitlines() if said in x], LIFE_S, "the CRL warning")
        assert time.time() > crl3_end - LIFE_S / 3 - 2
        assert len(line) == 1 and "WARNING" in line[0] and "nebula-admin provision renew" in line[0], line
        st = wait_until(lambda: _status(cfgs["A"]).get("expiry_warnings") and _status(cfgs["A"]), 5, "status warning")
        assert any("CRL" in w for w in st["expiry_warnings"]) and st["crl_next_update"] and st["ca_expires"]
        metrics = urllib.request.urlopen(f"http://{st['metrics']}/metrics", timeout=10).read().decode()
        gauge = [x for x in metrics.splitlines() if x.startswith('nebula_switch_expiry_seconds{what="crl"}')]
        assert gauge and 0 < float(gauge[0].split()[-1]) < LIFE_S / 3 + 2, gauge

        # past it: said once as an error; new connections refused, a reload refused, the live link goes on
        wait_until(lambda: time.time() > crl3_end + 1, LIFE_S, "the third CRL's expiry")
        said = f"expired at {second['crl_next_update']}"
        expired = wait_until(lambda: [x for x in a.log.read_text().splitlines() if said in x], 5, "the expiry error")
        assert len([x for x in a.log.read_text().splitlines() if f"expires at {second['crl_next_update']}" in x]) == 1
        assert len(expired) == 1 and "ERROR" in expired[0]
        refused = None
        try:
            with _handshake(a.wan, cfgs["B"].parent) as s:
                s.settimeout(10)
                s.recv(1)
        except (ssl.SSLError, ConnectionError) as exc:
            refused = exc
        assert refused is not None, "a new connection was accepted with an expired CRL"
        again = subprocess.run([str(BIN / "nebula-switch"), "reload", "--config", str(cfgs["A"])],
                               capture_output=True, text=True, timeout=60)
        assert again.returncode == 1 and "expired" in again.stderr, again.stdout + again.stderr
        traffic.flowing_after(time.time())
        assert (_accepted(a), _accepted(b)) == (accepted[0] + 1, accepted[1])  # (only the test's own connection)
    finally:
        traffic.close()
