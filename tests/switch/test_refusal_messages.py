"""Refusals said where they are felt: a cluster added before a peer applied the update that adds it hears which side
lacks whom and the update to apply; a probe from a site every peer refuses names the refusal by certificate. Real
switches from unpacked kits, a real update, the real CLI."""
from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from security.provision import add_cluster, provision
from switch_server.auditlimit import AuditThrottle
from switch_server.linklog import not_a_peer_text
from switch_server.metrics import SwitchMetrics
from switch_server.peers import PeerTrust
from switch_server.probe import cert_refusals, every_peer_refuses, unreached
from testbed.federation import Switch, edit_yaml, start_switch, wait_until

FAST = {"reconnect_initial_s": 0.05, "reconnect_max_s": 0.2}


def _unpack(out: Path, cluster: str, sites: Path) -> Path:
    """`cluster`'s kit unpacked at its own site (as an admin ships it); its switch.yaml, dialing fast."""
    site = sites / cluster
    site.mkdir(parents=True)
    subprocess.run(["tar", "xzf", str(out / "kits" / f"{cluster}.tar.gz"), "-C", str(site)], check=True)
    cfg = site / cluster / "switch.yaml"
    edit_yaml(cfg, lambda d: d.setdefault("link", {}).update(FAST))
    return cfg


def _lines(sw: Switch) -> list[str]:
    return sw.log.read_text(errors="replace").splitlines()


def _cli(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "switch_server.cli", *args], capture_output=True, text=True,
                          timeout=timeout_s)


def test_a_cluster_added_before_the_update_hears_who_lacks_it_and_a_probe_names_the_refusal(procs, tmp_path):
    out, sites = tmp_path / "admin", tmp_path / "sites"
    provision("fed", ["A", "B"], out)
    ya, yb = _unpack(out, "A", sites), _unpack(out, "B", sites)
    a, b = start_switch(procs, ya), start_switch(procs, yb)
    added = add_cluster(out, "C")  # C's kit at revision 2; A and B have not applied theirs yet
    yc = _unpack(out, "C", sites)
    c = start_switch(procs, yc)

    def said(sw: Switch, needle: str) -> list[str]:
        return [ln for ln in _lines(sw) if needle in ln and " DEBUG " not in ln]

    # C is told by each peer, and says in one line which side lacks whom and what to apply there
    for peer in ("A", "B"):
        got = wait_until(lambda: said(c, f"{peer}'s peers list has no cluster C"), 30, f"{peer}'s refusal in C's log")
        assert len(got) == 1 and " ERROR " in got[0], got
        assert f"apply the admin's updates/{peer}-r2.tar.gz (or a newer one for {peer}) with `nebula-switch " \
               f"reload --config <{peer}'s switch.yaml> --update {peer}-r2.tar.gz`" in got[0], got[0]
        assert "IncompleteReadError" not in got[0]
    # A says it once too (what it refused, and what would add C), then quietly counts C's further dials
    refused = wait_until(lambda: said(a, "is of cluster 'C', which is not in this switch's peers (B)"), 30, "A's line")
    assert len(refused) == 1 and "apply the update for this site that adds it" in refused[0]
    assert all(rec["detail"]["reason"] == "wrong_cluster" for rec in a.audit() if rec["action"] == "peer_rejected")
    assert [r["detail"]["reason"] for r in c.audit() if r["action"] == "refused_by_peer"] == ["not_a_peer"] * 2

    # a probe from C, which every peer refuses: named as a refusal by certificate, at once, in one line
    probe = _cli("probe", "--config", str(yc), "--send", "--to", "A", "--count", "3", "--bytes", "1024",
                 "--timeout", "20")
    assert probe.returncode != 0 and probe.stderr.count("\n") == 1, probe.stderr
    assert "every peer refused this switch's certificate (revoked or not in their peers list): A has no cluster " \
           "C in its peers list; B has no cluster C in its peers list" in probe.stderr, probe.stderr
    assert "is a receiver running?" not in probe.stderr

    # A applies its update as told: C's link to A comes up, and says how long it was down
    ok = _cli("reload", "--config", str(ya), "--update", added["updates"]["A"])
    assert ok.returncode == 0, ok.stdout + ok.stderr
    up = wait_until(lambda: said(c, "link to A up"), 30, "C's link to A")
    assert " down, " in up[0] and "failed attempts" in up[0], up[0]
    assert len(said(c, "A's peers list has no cluster C")) == 1  # (its dials meanwhile: not one line each)


def test_the_refusal_texts_name_the_side_and_the_update():
    text = not_a_peer_text("B", "D", "10.70.0.2:7443", 3)
    assert text.startswith("peer B (10.70.0.2:7443) refuses this switch's certificate: B's peers list has no "
                           "cluster D (B has not applied the update that adds D)")
    assert "--update B-r3.tar.gz" in text
    assert "the admin's newest update for B (updates/B-rN.tar.gz)" in not_a_peer_text("B", "D", "x:1", None)
    status = {"cluster": "C", "links": {
        "A": {"up": False, "last_error": "peer A (1.2.3.4:1) refuses this switch's certificate as revoked: its CRL"},
        "B": {"up": False, "last_error": not_a_peer_text("B", "C", "1.2.3.5:1", 2)}}}
    assert cert_refusals(status) == {"A": "A refuses it as revoked", "B": "B has no cluster C in its peers list"}
    assert every_peer_refuses(status)
    why = unreached(status, "A")
    assert why.startswith("every peer refused this switch's certificate (revoked or not in their peers list): A "
                          "refuses it as revoked; B has no cluster C in its peers list; if this cluster is still")
    assert "must apply the admin's update that adds C" in why
    # one peer merely down: not every peer refuses; the link's own reason is said
    status["links"]["B"] = {"up": False, "last_error": "ConnectionRefusedError: [Errno 111]"}
    assert not every_peer_refuses(status)
    assert unreached(status, "B") == "the link of switch C to B is down: ConnectionRefusedError: [Errno 111]"
    status["links"]["B"]["up"] = True
    assert unreached(status, "B") is None and not every_peer_refuses({"links": {}})


@pytest.mark.parametrize("code,level", [("not_a_peer", logging.ERROR), ("penalized", logging.WARNING)])
def test_a_peer_error_is_said_bounded_and_a_refusal_of_us_audited_once(code, level):
    audits: list[tuple] = []

    def audit(*rec) -> None:
        audits.append(rec)
    trust = PeerTrust(SwitchMetrics(None), audit, "switch:D", AuditThrottle(audit))

    class Link:
        cluster, address = "B", "10.0.0.2:7443"

    why, got = trust.peer_error(Link(), code, "x\x1b[31m" * 200, "D", 2)  # (the peer's words: hostile text)
    assert got == level and "\x1b" not in why and len(why) < 600
    trust.peer_error(Link(), code, "again", "D", 2)
    assert [a[1] for a in audits] == (["refused_by_peer"] if code == "not_a_peer" else [])


def test_an_inbound_refusal_is_logged_once_and_audited_each_time(caplog):
    audits: list[tuple] = []

    def audit(*rec) -> None:
        audits.append(rec)
    trust = PeerTrust(SwitchMetrics(None), audit, "switch:A", AuditThrottle(audit, period_s=3600.0, burst=5))
    with caplog.at_level(logging.DEBUG, logger="switch_server.peers"):
        for port in range(40000, 40050):
            trust.peer_rejected("?", f"10.0.0.3:{port}", "revoked", "certificate revoked", outgoing=False)
        trust.peer_rejected("?", "10.0.0.4:1", "revoked", "certificate revoked", outgoing=False)
    loud = [r.getMessage() for r in caplog.records if r.levelno > logging.DEBUG]
    assert len(loud) == 2 and loud[0].startswith("peer ? (10.0.0.3:40000) rejected: revoked") \
        and loud[1].startswith("peer ? (10.0.0.4:1)"), loud
    trust.audit_limited.flush(force=True)
    events = sum(1 + a[4].get("suppressed", 0) for a in audits if a[1] == "peer_rejected")
    assert events == 51
