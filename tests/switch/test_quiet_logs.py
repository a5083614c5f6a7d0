"""Quiet switch logs: one line per change of a peer's state, a summary while a failure repeats, every refusal still
audited. The state machines (`switch_server.linklog`) run on a fake clock; the switches are real processes."""
from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
from cryptography import x509

from security.ca import CertificateAuthority
from switch_server.auditlimit import AuditThrottle
from switch_server.linklog import MAX_REASONS, LinkLog, LogLine, RefusalLog, duration
from testbed.federation import Switch, edit_yaml, start_switch, wait_until


class Clock:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def said(lines: list[LogLine]) -> list[str]:
    """The lines logged at INFO or above."""
    return [ln.text for ln in lines if ln.level > logging.DEBUG]


# ---- the link's log ----

def test_a_peer_down_for_long_is_said_once_then_summarized():
    clock = Clock()
    lg = LinkLog("B", clock, summary_every_s=300)
    lines = [lg.failed("IncompleteReadError: 0 bytes read")]  # the session ended
    for _ in range(140):  # then 7 minutes of refused dials, one every 3 s
        clock.t += 3
        lines.append(lg.failed("ConnectionRefusedError: [Errno 111] Connect call failed"))
    out = said(lines)
    assert out[0].startswith("link to B not up yet: IncompleteReadError: 0 bytes read")
    assert out[1].startswith("link to B still down (3s, 2 attempts), now: ConnectionRefusedError")
    assert out[2:] == ["link to B down for 5m03s, 102 attempts, last: ConnectionRefusedError: [Errno 111] Connect "
                       "call failed"]
    assert len(lines) - len(out) == 138  # every other attempt: DEBUG only
    clock.t += 2
    assert lg.up() == " after 7m02s down, 141 failed attempts"
    clock.t += 3600
    line = lg.failed("TimeoutError: ")
    assert line.level == logging.INFO and line.text.startswith("link to B down after 1h00m up: TimeoutError")


def test_new_reasons_are_said_once_each_and_bounded():
    clock = Clock()
    lg = LinkLog("C", clock, summary_every_s=300)
    lines = []
    for i in range(3 * MAX_REASONS):
        for _ in range(5):  # each reason repeats
            clock.t += 1
            lines.append(lg.failed(f"reason {i}"))
    assert len(said(lines)) == MAX_REASONS  # the first line and the new reasons up to the bound
    assert lg.up() == f" after {duration(15 * MAX_REASONS - 1)} down, {15 * MAX_REASONS} failed attempts"
    assert LinkLog("D", clock).up() == ""  # (a first session: nothing to add)


def test_a_refusal_of_our_certificate_is_said_at_its_level_once():
    clock = Clock()
    lg = LinkLog("A", clock, summary_every_s=60)
    first = lg.failed("peer A refuses this switch's certificate as revoked", logging.ERROR)
    assert first.level == logging.ERROR
    levels = []
    for _ in range(30):
        clock.t += 5
        levels.append(lg.failed("peer A refuses this switch's certificate as revoked", logging.ERROR).level)
    assert levels.count(logging.ERROR) == 2 and set(levels) == {logging.DEBUG, logging.ERROR}  # two summaries


def test_bad_periods_are_refused():
    with pytest.raises(ValueError):
        LinkLog("B", summary_every_s=0)
    with pytest.raises(ValueError):
        RefusalLog(max_keys=0)
    with pytest.raises(ValueError):
        LogLine(7, "x")


# ---- refusals of peers ----

def test_a_refused_peer_is_said_first_then_summarized_per_period():
    clock = Clock()
    rl = RefusalLog(clock, summary_every_s=300)
    kind = ("10.0.0.3", "revoked")
    lines = []
    for i in range(120):  # a revoked peer dials every 4 s for 8 minutes
        clock.t += 4
        lines += rl.refused(kind, f"peer ? (10.0.0.3:{40000 + i}) rejected: revoked: certificate revoked")
    out = said(lines)
    assert len(out) == 2, out
    assert out[0].endswith("rejected: revoked: certificate revoked (repeats are summarized every 5m00s)")
    assert out[1] == ("75 more refusals like this in the last 5m00s (5m00s since the first), last: peer ? "
                      "(10.0.0.3:40075) rejected: revoked: certificate revoked")
    assert sum(ln.level == logging.DEBUG for ln in lines) == 118


def test_refusals_of_other_kinds_bring_due_summaries_and_quiet_kinds_are_forgotten():
    clock = Clock()
    rl = RefusalLog(clock, summary_every_s=60)
    assert len(said(rl.refused("a", "A refused"))) == 1
    clock.t += 1
    assert said(rl.refused("a", "A refused again")) == []
    clock.t += 60
    # another kind's refusal brings a's summary, which was due
    out = said(rl.refused("b", "B refused"))
    assert out[0].startswith("1 more refusal like this in the last 1m01s") and out[1].startswith("B refused")
    clock.t += 120
    assert rl.due() == [] and said(rl.refused("a", "A is back")) == ["A is back (repeats are summarized every "
                                                                     "1m00s)"]


def test_refusal_kinds_are_bounded():
    clock = Clock()
    rl = RefusalLog(clock, summary_every_s=60, max_keys=4)
    for i in range(4):
        rl.refused(i, f"kind {i}")
        clock.t += 1
        rl.refused(i, f"kind {i} again")
    out = said(rl.refused("new", "a fifth kind"))
    assert out[0].startswith("1 more refusal like this") and out[0].endswith("kind 0 again")
    assert len(rl._kinds) == 4


def test_every_refusal_is_counted_in_the_audit_log():
    records: list[dict] = []
    throttle = AuditThrottle(lambda *a: records.append(a[4]), period_s=60.0, burst=5)
    for i in range(1000):
        throttle(("peer_rejected", "revoked", "10.0.0.3", "in"), "switch:A", "peer_rejected", "?", "denied",
                 {"reason": "revoked", "n": i})
    throttle.flush()  # (the period has not ended: nothing yet)
    assert len(records) == 5
    throttle.flush(force=True)  # at a stop
    assert len(records) == 6 and records[-1]["suppressed"] == 994 and records[-1]["n"] == 999
    assert sum(1 + r.get("suppressed", 0) for r in records) == 1000


# ---- real switches ----

def _lines(sw: Switch) -> list[str]:
    return sw.log.read_text(errors="replace").splitlines()


FAST = {"reconnect_initial_s": 0.02, "reconnect_max_s": 0.05}  # a dial every 25-50 ms instead of up to 5 s


def test_a_stopped_peer_is_said_once_and_counted_when_back(procs, federation):
    ya, yb = (Path(federation["clusters"][c]["switch_yaml"]) for c in ("A", "B"))
    edit_yaml(ya, lambda d: d.setdefault("link", {}).update(FAST))
    a = start_switch(procs, ya, args=["--log-level", "debug"])
    b = start_switch(procs, yb)
    wait_until(lambda: any("link to B up" in ln for ln in _lines(a)), 30, "A's link to B")
    start = len(_lines(a))
    assert b.stop() == 0
    # each failed dial is one DEBUG line: wait for 150 of them
    attempts = lambda: [ln for ln in _lines(a)[start:] if " DEBUG switch_server.link: link to B down" in ln]
    wait_until(lambda: len(attempts()) >= 150, 60, "150 dials of the stopped peer")
    loud = [ln for ln in _lines(a)[start:] if "link to B" in ln and " DEBUG " not in ln]
    # the session's end, and the refused dials that followed: two lines for 150 attempts
    assert 1 <= len(loud) <= 2, loud
    assert "link to B down after" in loud[0] and "up: " in loud[0]
    b = start_switch(procs, yb)
    back = wait_until(lambda: [ln for ln in _lines(a)[start:] if "link to B up" in ln], 30, "A's link to B again")
    m = re.search(r"after \S+ down, (\d+) failed attempts", back[0])
    assert m and int(m.group(1)) >= 150, back[0]


def test_a_revoked_peer_is_said_once_and_every_refusal_audited(procs, federation):
    ya, yb = (Path(federation["clusters"][c]["switch_yaml"]) for c in ("A", "B"))
    for y in (ya, yb):
        edit_yaml(y, lambda d: d.setdefault("link", {}).update(FAST))
    # B keeps a CRL of its own (the kits share the CA's): the revocation reaches A only, so B goes on dialing
    crl_b = yb.parent / "crl.pem"
    own = crl_b.read_bytes()
    crl_b.unlink()
    crl_b.write_bytes(own)
    a = start_switch(procs, ya, args=["--log-level", "debug"])
    b = start_switch(procs, yb, args=["--log-level", "debug"])
    wait_until(lambda: any("link to B up" in ln for ln in _lines(a)), 30, "A's link to B")
    serial = x509.load_pem_x509_certificate((yb.parent / "switch.pem").read_bytes()).serial_number
    CertificateAuthority.open(federation["ca"]).revoke(serial, "key_compromise")
    # A re-reads the CRL within 5 s and cuts B; B's dials are refused from then on (and A's of B: its certificate)
    def refusals(direction: str) -> list[str]:
        who = "peer ? (" if direction == "in" else "peer B ("
        return [ln for ln in _lines(a) if "switch_server.peers: " + who in ln and "rejected: revoked" in ln]
    wait_until(lambda: len(refusals("in")) >= 100, 90, "100 refused dials of the revoked peer")
    assert b.stop() == 0  # no more dials: the audit log catches up (its summaries every second)
    loud = [ln for ln in refusals("in") if " DEBUG " not in ln]
    assert len(loud) == 1 and " WARNING " in loud[0] and "repeats are summarized every 5m00s" in loud[0], loud
    assert all(" DEBUG " in ln for ln in refusals("out"))  # (A's link says those, once: `LinkLog`)

    def audited(direction: str) -> int:
        recs = [r for r in a.audit() if r["action"] == "peer_rejected" and r["detail"]["reason"] == "revoked"
                and r["detail"].get("direction") == direction]
        return sum(1 + r["detail"].get("suppressed", 0) for r in recs)
    for direction in ("in", "out"):
        n = len(refusals(direction))
        wait_until(lambda: audited(direction) == n, 30, f"{n} refusals ({direction}) in A's audit log")
    # B said once that A refuses it (with the fix), and retried quietly
    said_b = [ln for ln in _lines(b) if "refuses this switch's certificate as revoked" in ln and " DEBUG " not in ln]
    assert len(said_b) == 1 and " ERROR " in said_b[0] and "from the federation's admin" in said_b[0], said_b
