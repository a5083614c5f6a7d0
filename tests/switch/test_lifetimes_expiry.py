"""The switch's expiry watch without a switch: margins (the CRL's a third of its lifetime at most), one WARNING on
entering a margin and not on every tick, again after a day, one ERROR on expiry, INFO once renewed; the lines name
what expires when and the command that fixes it."""
from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from security.certbuild import SKEW
from switch_server.expiry import REPEAT_S, Expiry, ExpiryWatch, expiries, warning_line

DAY = 86400.0
T = 1_800_000_000.0


def test_the_crl_margin_is_a_third_of_its_lifetime_at_most_and_the_others_the_configured_days():
    skew = SKEW.total_seconds()
    got = {e.what: e.margin_s for e in expiries(T + 30 * DAY, T + 3650 * DAY, T + 7 * DAY, T - skew, 7, {})}
    assert got == {"certificate": 7 * DAY, "ca": 7 * DAY, "crl": pytest.approx(7 * DAY / 3)}
    short = {e.what: e.margin_s for e in expiries(T, T, T + 30 * DAY, T - skew, 2, {})}
    assert short["crl"] == 2 * DAY  # (the configured margin is less than a third of 30 days)
    assert [e.what for e in expiries(T, T, None, None, 7, {})] == ["certificate", "ca"]  # no next update: never
    with pytest.raises(ValueError, match="margin"):
        Expiry("crl", T, -1.0, "crl.pem")
    with pytest.raises(ValueError, match="expected one of"):
        Expiry("key", T, 1.0, "x")


def _watch(crl_next: float) -> ExpiryWatch:
    w = ExpiryWatch()
    w.current = expiries(T + 30 * DAY, T + 3650 * DAY, crl_next, crl_next - 9 * DAY - SKEW.total_seconds(), 7,
                         {"certificate": "switch.pem", "ca": "ca.pem", "crl": "crl.pem"})
    return w


def test_a_warning_is_said_once_on_entering_the_margin_again_daily_and_an_error_once_expired():
    w = _watch(T + 2 * DAY)  # a 9-day CRL: margin 3 days, so it is within it now
    first = w.tick(T, "A", "switch.yaml")
    assert [lvl for lvl, _ in first] == [logging.WARNING]
    line = first[0][1]
    assert "CRL crl.pem expires at" in line and "(in 2.0 days)" in line and "nebula-admin provision renew" in line
    assert "nebula-switch reload --config switch.yaml --update A-rN.tar.gz" in line and "\n" not in line
    assert w.tick(T + 60, "A", "switch.yaml") == []  # not every tick
    assert w.warnings(T + 60, "A", "switch.yaml") == [warning_line(w.current[2], T + 60, "A", "switch.yaml")]
    assert [lvl for lvl, _ in w.tick(T + REPEAT_S + 60, "A", "switch.yaml")] == [logging.WARNING]  # a day on
    gone = w.tick(T + 2 * DAY + 1, "A", "switch.yaml")
    assert [lvl for lvl, _ in gone] == [logging.ERROR] and "expired at" in gone[0][1]
    assert w.tick(T + 2 * DAY + 2, "A", "switch.yaml") == []
    # a renewed CRL (applied with the admin's update) is said once, and the warnings are gone
    w.current = _watch(T + 20 * DAY).current
    back = w.tick(T + 2 * DAY + 3, "A", "switch.yaml")
    assert [lvl for lvl, _ in back] == [logging.INFO] and "renewed" in back[0][1]
    assert w.warnings(T + 2 * DAY + 3, "A", "switch.yaml") == []


def test_the_certificate_and_ca_lines_name_their_fix():
    w = _watch(T + 9 * DAY)
    cert = warning_line(Expiry("certificate", T + DAY, 7 * DAY, "switch.pem"), T, "A", "fed/A/switch.yaml")
    assert "certificate switch.pem of switch A expires at" in cert
    assert "nebula-switch csr --config fed/A/switch.yaml" in cert
    ca = warning_line(Expiry("ca", T - 1, 7 * DAY, "ca.pem"), T, "A", "fed/A/switch.yaml")
    assert "CA certificate ca.pem expired at" in ca and "nebula-admin provision --from" in ca
    assert w.tick(T, "A", "s.yaml") == []  # nothing within its margin: nothing said


def test_the_watch_reads_the_files_of_a_kit(tmp_path):
    from security.provision import provision
    from nebula.config.switch import load_switch_config

    fed = provision("acme", ["A"], tmp_path / "fed")
    cfg = load_switch_config(fed["clusters"]["A"]["switch_yaml"])
    got = {e.what: e for e in ExpiryWatch().refresh(SimpleNamespace(tls=cfg.tls), T)}
    assert set(got) == {"certificate", "ca", "crl"} and got["certificate"].at == T
    assert got["ca"].at - got["crl"].at > 3000 * DAY and got["crl"].margin_s == pytest.approx(7 * DAY / 3, rel=0.01)
