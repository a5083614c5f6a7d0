"""`nebula-admin federation status` and `nebula-switch status`: one view of the federation from the sites' status
files (and a switch's metrics endpoint), read from real switches on loopback; the rendering and the disagreements it
flags, from hand-written statuses; a status file from a site is not trusted."""
from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from security.federation_view import (Totals, disagreements, format_age, format_bytes, render, site_from_metrics,
                                      site_from_status, to_json)
from security.provision import add_cluster, provision
from testbed.federation import BIN, start_switch

# printed in README.md ("Running a federation by hand"); run as printed by test_three_switches_in_one_view
PRINTED = ["cp fed/A/state/status.json A.status.json", "nebula-admin federation status --dir status"]
NOW = 1_800_000_000.0
DAY = 86400


def _at(offset_s: float) -> str:
    """The ISO time `offset_s` after NOW."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(NOW + offset_s))


def _status(cluster: str, links: dict[str, bool], *, age: float = 1.0, **extra) -> dict:
    """A switch's status.json as `switch_server.status` writes it, `age` seconds before NOW."""
    return {
        "time": NOW - age, "cluster": cluster, "epoch": 2, "pid": 7,
        "links": {p: {"up": up, "rtt_ms": 1.5 if up else None, "bytes_out": 3 << 20, "mbit_out": 0.0,
                      "queued_bytes": 0, "unacked_bytes": 0, "last_error": "" if up else "connection refused"}
                  for p, up in links.items()},
        "sessions": {p: {"bytes_in": 2048, "mbit_in": 0.0} for p, up in links.items() if up},
        "certificate_expires": _at(30 * DAY).replace("Z", "+00:00"), **extra,
    }


def _view(statuses: dict[str, dict], stale_after: float = 60.0):
    return [site_from_status(n, f"{n}.status.json", st, NOW, stale_after) for n, st in statuses.items()]


# ---- the view, from hand-written statuses ----

def test_render_one_table_with_totals_expiry_and_checkpoint():
    """A row per site and link: state, RTT, bytes moved since start, messages, time left on certificate, CA and CRL,
    the last checkpoint; expiry warnings under the table."""
    a = _status("A", {"B": True}, started=NOW - 7500, ca_expires=_at(3650 * DAY),
                crl_next_update=_at(5 * DAY + 3 * 3600), expiry_warnings=["CRL expires in 2 days: apply the update"],
                audit_checkpoint={"seq": 41, "time": NOW - 90})
    a["links"]["B"].update(bytes_in=5 << 30, frames_out=120, frames_in=3000)
    b = _status("B", {"A": True})
    sites = _view({"A": a, "B": b})
    text = render(sites, disagreements(sites), NOW)
    header, row_a, row_b = text.splitlines()[:3]
    assert header.split()[:4] == ["SITE", "STATUS", "UPTIME", "CERT"]
    assert row_a.split() == ["A", "ok", "2h05m", "30d00h", "3650d00h", "5d03h", "#41", "1m", "ago", "B", "up",
                             "1.50", "3.0", "MiB", "5.0", "GiB", "120", "3000"]
    # B's status has no totals of its own inbound: the session's bytes (since the session began) stand in
    assert row_b.split()[:2] == ["B", "ok"] and "2.0 KiB" in row_b and row_b.split()[-2:] == ["-", "-"]
    assert "A: CRL expires in 2 days: apply the update" in text
    assert text.splitlines()[-1] == "2 site(s): 2 current, 0 stale or unreadable; 0 disagreement(s)"
    got = to_json(sites, [], NOW)["sites"][0]
    assert got["uptime_s"] == 7500 and got["audit_checkpoint"] == {"seq": 41, "time": NOW - 90}
    assert got["links"]["B"] == {"up": True, "rtt_ms": 1.5, "bytes_out": 3 << 20, "bytes_in": 5 << 30,
                                 "frames_out": 120, "frames_in": 3000, "last_error": ""}
    assert got["certificate_expires"] == _at(30 * DAY) and got["crl_next_update"] == _at(5 * DAY + 3 * 3600)


def test_stale_and_unreadable_sites_are_marked_and_left_out_of_disagreements():
    """A status older than --stale-after is stale; a file that is no status is unreadable; neither's view of its
    links counts against the others."""
    sites = _view({"A": _status("A", {"B": True, "C": True}), "B": _status("B", {"A": False}, age=600),
                   "C": ["not", "a", "status"]})
    assert [(s.stale, s.error) for s in sites] == [
        (False, None), (True, None), (False, "not a switch status (a JSON object is expected)")]
    assert disagreements(sites) == []
    text = render(sites, [], NOW)
    assert "B     stale 10m" in text and "C     unreadable" in text
    assert "B: status is 10m old (B.status.json)" in text and "C: cannot read C.status.json: not a switch" in text


def test_disagreements_between_sites_are_flagged():
    """A says its link to B is up while B says down; C lacks a link to A (no peers update applied); B links to D,
    which no site read."""
    sites = _view({"A": _status("A", {"B": True, "C": True}), "B": _status("B", {"A": False, "C": True, "D": False}),
                   "C": _status("C", {"B": True})})
    assert disagreements(sites) == [
        "A says its link to B is up, B says its link to A is down",
        "B has a link to D, which is not among the sites read (removed from the federation? then apply the peers "
        "update that drops it at B)",
        "C has no link to A while A is in the federation: apply the latest peers update at C "
        "(nebula-switch reload --update)",
    ]


def test_nothing_in_a_status_file_is_trusted():
    """Fields of the wrong type read as absent, strings are made safe for a terminal, a status of another cluster is
    noted."""
    st = _status("B", {"A\x1b[2J": True}, certificate_expires=12, expiry_warnings=["\x1b]0;owned\x07", 5],
                 started="yesterday", audit_checkpoint={"seq": -1, "time": "x"})
    st["links"]["A\x1b[2J"].update(rtt_ms=float("nan"), bytes_out=-5, up="yes", last_error="x\ny")
    st["sessions"] = "nope"
    site = site_from_status("A", "a.json", st, NOW, 60)
    (lk,) = site.links
    assert lk.peer == "A\\x1b[2J" and lk.up is None and lk.rtt_ms is None and lk.last_error == "x\\ny"
    assert lk.totals == Totals()
    assert site.certificate_expires is None and site.started is None and site.checkpoint_seq is None
    assert site.expiry_warnings == ("\\x1b]0;owned\\x07",)
    assert site.notes == ("the status of A names cluster B",)
    assert "\x1b" not in render([site], [], NOW)
    assert site_from_status("A", "a.json", {"time": "now"}, NOW, 60).error == "not a switch status (no `time`)"


def test_metrics_text_gives_links_totals_and_expiry():
    """A switch's Prometheus text: links, RTT, bytes and frames summed over lanes, certificate expiry."""
    text = "\n".join([
        'nebula_switch_link_up{peer="B"} 1.0', 'nebula_switch_link_up{peer="C"} 0.0',
        'nebula_switch_rtt_seconds{peer="B"} 0.0025',
        'nebula_switch_bytes_total{direction="out",lane="bulk",peer="B"} 1000.0',
        'nebula_switch_bytes_total{direction="out",lane="control",peer="B"} 24.0',
        'nebula_switch_bytes_total{direction="in",lane="control",peer="B"} 48.0',
        'nebula_switch_frames_total{direction="out",lane="bulk",peer="B"} 3.0',
        'nebula_switch_certificate_expiry_seconds 86400.0', ""])
    site = site_from_metrics("A", "http://x/metrics", text, NOW)
    assert [(lk.peer, lk.up, lk.rtt_ms) for lk in site.links] == [("B", True, 2.5), ("C", False, None)]
    assert site.links[0].totals == Totals(bytes_out=1024, bytes_in=48, frames_out=3, frames_in=0)
    assert site.certificate_expires == time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(NOW + 86400))
    assert site_from_metrics("A", "u", "<html>hello</html>", NOW).error is not None


def test_formats():
    assert [format_bytes(n) for n in (None, 0, 1023, 1024, 5 << 20, 3 << 40)] == [
        "-", "0 B", "1023 B", "1.0 KiB", "5.0 MiB", "3.0 TiB"]
    assert [format_age(s) for s in (None, 5, 600, 3900, 90000)] == ["-", "5s", "10m", "1h05m", "1d01h"]


# ---- real switches ----

def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / args[0]), *args[1:]], capture_output=True, text=True, timeout=60, cwd=cwd)


def _printed(command: str, cwd: Path) -> subprocess.CompletedProcess:
    """Run a command as printed in the README, with the venv's programs first on PATH."""
    argv = shlex.split(command)
    prog = BIN / argv[0] if (BIN / argv[0]).exists() else shutil.which(argv[0])
    return subprocess.run([str(prog), *argv[1:]], capture_output=True, text=True, timeout=60, cwd=cwd)


def _wait_links(config: Path, want: dict[str, bool], timeout_s: float = 30.0) -> dict:
    """The switch's status once its links are as `want` says."""
    deadline = time.monotonic() + timeout_s
    got: dict = {}
    while time.monotonic() < deadline:
        run = _cli("nebula-switch", "status", "--config", str(config), "--json")
        if run.returncode == 0:
            got = json.loads(run.stdout)
            links = got["links"]
            # (up, and, when up, its RTT measured: the first ping's answer)
            if all(links.get(p, {}).get("up") == up and (not up or links[p]["rtt_ms"] is not None)
                   for p, up in want.items()):
                return got
        time.sleep(0.2)
    raise AssertionError(f"links of {config} not {want}: {got.get('links')}")


def _wait_moved(config: Path, peer: str, nbytes: int, timeout_s: float = 30.0) -> None:
    """Wait until the switch's status file says it sent `peer` at least `nbytes` (it is rewritten every second)."""
    path = config.parent / "state" / "status.json"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            sent = json.loads(path.read_text())["links"][peer]["bytes_out"]
        except (OSError, ValueError, KeyError):
            sent = -1  # (no status yet, or the link not in it yet: read it again)
        if sent >= nbytes:
            return
        time.sleep(0.2)
    raise AssertionError(f"{path}: fewer than {nbytes} bytes sent to {peer} after {timeout_s} s")


def test_three_switches_in_one_view(procs, tmp_path):
    """Three real switches; each site's status file copied into one directory (as printed); the admin's view has
    every link up with bytes moved and certificate expiry, exit 0; then a cluster added before B applied its update:
    flagged, exit 1; a stopped site's old copy: stale."""
    fed = tmp_path / "fed"
    provision("acme", ["A", "B", "C"], fed)
    cfg = {c: fed / c / "switch.yaml" for c in "ABC"}
    for c in "ABC":
        start_switch(procs, cfg[c])
    for c in "ABC":
        _wait_links(cfg[c], {p: True for p in "ABC" if p != c})
    # 20 messages of 64 KiB from A to B (links carry only pings otherwise, which count as no bytes moved)
    recv = procs.python("-m", "switch_server.cli", "probe", "--config", str(cfg["B"]), "--recv", "--count", "20")
    sent = _cli("nebula-switch", "probe", "--config", str(cfg["A"]), "--send", "--to", "B", "--count", "20",
                "--bytes", "65536")
    assert sent.returncode == 0 and recv.wait(timeout=60) == 0, sent.stdout + sent.stderr
    _wait_moved(cfg["A"], "B", 20 * 65536)
    status = tmp_path / "status"
    status.mkdir()
    for c in "ABC":  # each site copies its status (the README's command for A; B and C likewise)
        run = _printed(PRINTED[0].replace("A", c), tmp_path)
        assert run.returncode == 0, run.stderr
        shutil.move(tmp_path / f"{c}.status.json", status / f"{c}.status.json")

    run = _printed(PRINTED[1], tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].split()[:3] == ["SITE", "STATUS", "UPTIME"]
    links, site = [], None
    for ln in lines[1:7]:  # a row per link; a site's name on its first row only
        cells = ln.split()
        site = site if ln.startswith(" ") else cells[0]
        links.append((site, cells[-9], cells[-8]))  # site, peer, state (then rtt, sent, received, messages)
    assert links == [("A", "B", "up"), ("A", "C", "up"), ("B", "A", "up"), ("B", "C", "up"), ("C", "A", "up"),
                     ("C", "B", "up")]
    assert lines[-1] == "3 site(s): 3 current, 0 stale or unreadable; 0 disagreement(s)"
    got = json.loads(_cli("nebula-admin", "federation", "status", "--dir", str(status), "--json").stdout)
    assert [s["name"] for s in got["sites"]] == ["A", "B", "C"] and got["disagreements"] == []
    for s in got["sites"]:
        assert s["error"] is None and not s["stale"] and s["certificate_expires"] and s["epoch"] == 1
        assert set(s["links"]) == set("ABC") - {s["name"]}
        assert all(lk["up"] and lk["rtt_ms"] is not None for lk in s["links"].values()), s
    a_b = got["sites"][0]["links"]["B"]
    assert a_b["bytes_out"] >= 20 * 65536 and got["sites"][1]["links"]["A"]["bytes_in"] >= 20 * 65536
    assert next(ln for ln in lines if ln.startswith("A ")).split()[-9:-6] == ["B", "up", f"{a_b['rtt_ms']:.2f}"]

    # the switch's own status: totals since start (bytes, and messages from its metrics), uptime
    text = _cli("nebula-switch", "status", "--config", str(cfg["A"])).stdout
    head, *_ = text.splitlines()
    assert head.startswith("switch A epoch 1 pid ") and " up " in head and "(since " in head
    row_b = next(ln.split() for ln in text.splitlines() if ln.split()[:2] == ["B", "up"])
    # peer, state, rtt, out and in Mbit/s, sent, received, frames out and in (from the switch's metrics), ...
    assert row_b[6] == "MiB" and float(row_b[5]) >= 1.25 and int(row_b[9]) > 0 and int(row_b[10]) > 0, text
    assert "certificate expires " in text and next(ln for ln in text.splitlines() if ln.split()[0] == "total")

    # the switch's metrics endpoint is a source too
    metrics = json.loads((fed / "A" / "state" / "status.json").read_text())["metrics"]
    live = json.loads(_cli("nebula-admin", "federation", "status", "--status", f"A=http://{metrics}/metrics",
                           "--json").stdout)["sites"][0]
    assert live["error"] is None and live["links"]["B"]["up"] and live["links"]["B"]["bytes_out"] >= 20 * 65536
    assert live["links"]["B"]["frames_out"] > 0

    # D added while B has not applied its peers update: D's link to B is refused, B has no link to D
    add_cluster(fed, "D")  # (the switches run from the admin's directory: their switch.yaml now names D)
    took = _cli("nebula-switch", "reload", "--config", str(cfg["A"]))
    assert took.returncode == 0, took.stderr
    d_cfg = fed / "D" / "switch.yaml"
    d = start_switch(procs, d_cfg)
    _wait_links(d_cfg, {"A": True})
    for c, path in (("A", cfg["A"]), ("B", cfg["B"]), ("D", d_cfg)):
        shutil.copy(path.parent / "state" / "status.json", status / f"{c}.status.json")
    run = _cli("nebula-admin", "federation", "status", "--dir", str(status))
    assert run.returncode == 1
    assert "B has no link to D while D is in the federation: apply the latest peers update at B" in run.stdout
    assert "C has no link to D while D is in the federation: apply the latest peers update at C" in run.stdout

    # D stops; the copy it sent last is an hour old by the time the admin looks
    assert d.stop() == 0
    old = json.loads((d_cfg.parent / "state" / "status.json").read_text())
    (status / "D.status.json").write_text(json.dumps(dict(old, time=time.time() - 3600)))
    run = _cli("nebula-admin", "federation", "status", "--dir", str(status), "--json")
    site = {s["name"]: s for s in json.loads(run.stdout)["sites"]}
    assert run.returncode == 1 and site["D"]["stale"] and not site["A"]["stale"]
    assert not [f for f in json.loads(run.stdout)["disagreements"] if "D" in f.split()]  # (D's view is not current)


@pytest.mark.parametrize("argv, says", [
    (["--status", "A"], "--status 'A' is not NAME=SOURCE"),
    (["--dir", "/nonexistent/dir"], "--dir /nonexistent/dir: not a directory"),
    ([], "no site given"),
    (["--dir", ".", "--stale-after", "0"], "--stale-after 0.0 must be a positive number"),
])
def test_usage_errors_are_one_line_and_exit_2(argv, says, tmp_path):
    run = _cli("nebula-admin", "federation", "status", *argv, cwd=tmp_path)
    assert run.returncode == 2 and run.stderr.count("\n") == 1 and says in run.stderr, run.stderr
