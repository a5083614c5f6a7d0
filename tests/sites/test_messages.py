"""What an operator sees: every message one line naming the address, key or path and the fix, against real switch
processes: a second start, taken ports, a worker started before its switch, a revoked switch, a reload's outcome,
and a probe that reports what its receiver took (the tests with several clusters put each in its own namespace)."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from nebula.config import stream_path
from security.provision import provision, remove_cluster
from testbed.federation import LocalFederation, edit_yaml, start_switch, wait_audit
from testbed.netns import Sites


def _serve(config: Path, timeout_s: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "switch_server.cli", "serve", "--config", str(config)],
                          capture_output=True, text=True, timeout=timeout_s)


def _lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.strip()]


def test_a_second_start_names_the_running_switch_and_changes_nothing(procs, tmp_path):
    fed = provision("fed", ["A", "B"], tmp_path / "fed")
    cfg = Path(fed["clusters"]["A"]["switch_yaml"])
    a = start_switch(procs, cfg)
    epoch, log = (cfg.parent / "state" / "epoch").read_text(), (cfg.parent / "audit.log").read_bytes()
    again = _serve(cfg)
    assert again.returncode == 2 and len(_lines(again.stderr)) == 1
    assert (f"switch A is already running (pid {a.proc.pid}, state directory {cfg.parent / 'state'}); stop it "
            f"first (kill {a.proc.pid}), or apply changes to it live with `nebula-switch reload --config {cfg}`"
            in again.stderr)
    # the failed start took no epoch and wrote nothing into the running switch's audit log
    assert (cfg.parent / "state" / "epoch").read_text() == epoch
    assert (cfg.parent / "audit.log").read_bytes()[:len(log)] == log
    assert not [r for r in a.audit() if r["action"] in ("switch_stopped", "switch_start_failed")]
    assert a.proc.poll() is None


def test_taken_ports_are_one_line_naming_the_key_and_the_fix(tmp_path):
    fed = provision("fed", ["A", "B"], tmp_path / "fed")
    cfg = Path(fed["clusters"]["A"]["switch_yaml"])
    edit_yaml(cfg, lambda d: d["local"].update(ipc_endpoint=""))
    doc = yaml.safe_load(cfg.read_text())
    wan_port = int(doc["listen"].rpartition(":")[2])
    local_port = int(doc["local"]["endpoint"].rpartition(":")[2])
    for key, port, value in (("listen", wan_port, doc["listen"]), ("local.endpoint", local_port,
                                                                   doc["local"]["endpoint"])):
        with socket.create_server(("127.0.0.1", port)):  # another program holds the port
            r = _serve(cfg)
        assert r.returncode == 2 and len(_lines(r.stderr)) == 1, r.stderr
        assert (f"cannot bind {key} {value}: address already in use: another process holds port {port} (find it "
                f"with `ss -ltnp 'sport = :{port}'`); stop it, or give this switch another port in `{key}` of "
                f"{cfg}") in r.stderr
        assert not (cfg.parent / "state" / "epoch").exists()  # a start that bound nothing took no epoch
    failed = [json.loads(ln) for ln in (cfg.parent / "audit.log").read_text().splitlines()
              if '"switch_start_failed"' in ln]
    assert [r["detail"]["reason"].split(" ")[2] for r in failed] == ["listen", "local.endpoint"]


def test_a_worker_started_before_its_switch_says_it_waits_for_it(procs, tmp_path):
    fed = provision("fed", ["A", "B"], tmp_path / "fed")
    code = ("import sys\nfrom nebula.channel import Endpoint\n"
            "with Endpoint.connect(sys.argv[1], job='j', rank=0, timeout_s=120):\n    print('connected', flush=True)\n")
    worker = procs.python("-c", code, fed["clusters"]["A"]["worker_yaml"])
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(iter(worker.stdout.readline, "")), daemon=True).start()
    deadline = time.monotonic() + 60
    while not any("waiting for its switch" in ln for ln in lines) and time.monotonic() < deadline:
        time.sleep(0.1)
    said = [ln for ln in lines if "waiting for its switch" in ln]
    assert len(said) == 1 and "connected" not in "".join(lines)
    doc = yaml.safe_load(Path(fed["clusters"]["A"]["switch_yaml"]).read_text())
    assert (f"worker worker of cluster A: waiting for its switch at {stream_path(doc['local']['ipc_endpoint'])}, "
            "where nothing "
            "answers yet: start the switch (`nebula-switch serve --config switch.yaml` on its host)") in said[0]
    start_switch(procs, Path(fed["clusters"]["A"]["switch_yaml"]))
    assert worker.wait(90) == 0
    assert "connected\n" in lines and any("answers now" in ln for ln in lines)


@pytest.mark.root
def test_a_revoked_switch_says_so_once_and_stops(procs, tmp_path):
    with Sites(["A", "B", "C"]) as sites:
        try:
            fed = LocalFederation(tmp_path / "fed", ["A", "B", "C"], procs=procs, sites=sites)
            remove_cluster(tmp_path / "fed", "C")  # C's certificates revoked: the CRL every kit here links changes
            c = fed.switches["C"]
            assert c.proc.wait(60) == 3
            # a restart is refused at once, for the same reason, in one line
            again = subprocess.run(sites.argv("C", [sys.executable, "-m", "switch_server.cli", "serve", "--config",
                                                    str(c.config)]), capture_output=True, text=True, timeout=60)
            # the others go on: they cut C and keep their link
            assert all(s.proc.poll() is None for k, s in fed.switches.items() if k != "C")
            wait_audit(fed.switches["A"], lambda r: r["action"] == "crl_reload" and r["detail"]["revoked"] == 2, 30)
        finally:
            procs.reap()
    text = c.log.read_text()
    assert "Traceback" not in text and "getpeercert" not in text
    said = [ln for ln in text.splitlines() if "switch C stops" in ln]
    assert len(said) == 1 and "its own certificate" in said[0] and "is revoked in the CRL" in said[0]
    assert "ask its admin for a new kit (`nebula-admin provision add-cluster`)" in said[0]
    refused = [ln.split("peer ")[1].split(" ")[0] for ln in text.splitlines() if "refuses this switch's" in ln]
    assert len(refused) == len(set(refused))  # (the peers that cut it first: once each)
    assert wait_audit(c, lambda r: r["action"] == "own_certificate_revoked")["outcome"] == "denied"
    assert again.returncode == 2 and len(_lines(again.stderr)) == 1 and "is revoked in the CRL" in again.stderr


def test_reload_reports_what_the_running_switch_did(procs, tmp_path):
    fed = provision("fed", ["A", "B"], tmp_path / "fed")
    cfg = Path(fed["clusters"]["A"]["switch_yaml"])
    a = start_switch(procs, cfg)

    def reload() -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "switch_server.cli", "reload", "--config", str(cfg)],
                              capture_output=True, text=True, timeout=60)

    ok = reload()
    assert ok.returncode == 0 and ok.stdout.strip() == (f"switch A (pid {a.proc.pid}) reloaded {cfg}: peers B; "
                                                        "the CRL revokes 0 certificate(s)")
    text = cfg.read_text()
    edit_yaml(cfg, lambda d: d.update(link={"chunk_bytes": 0}))  # a file the loader refuses: the switch is not asked
    bad = reload()
    assert bad.returncode == 2 and len(_lines(bad.stderr)) == 1 and "link.chunk_bytes=0 must be > 0" in bad.stderr
    assert "the running switch was not asked and keeps its configuration" in bad.stderr
    cfg.write_text(text)
    edit_yaml(cfg, lambda d: d.update(cluster="Z"))  # a file the switch refuses to take live
    bad = reload()
    assert bad.returncode == 1 and len(_lines(bad.stderr)) == 1
    assert (f"switch A (pid {a.proc.pid}) refused the reload and keeps its running configuration: cluster and "
            "federation cannot change on reload; restart the switch") in bad.stderr
    cfg.write_text(text)
    assert reload().returncode == 0  # (the running configuration was kept: the same file reloads fine)
    a.stop()
    gone = reload()
    assert gone.returncode == 1 and "switch A is not running" in gone.stderr and "nebula-switch serve" in gone.stderr


_SLOW_RECEIVER = """
import sys, time
from nebula.channel import Endpoint
from switch_server.probe import PROBE_CHANNEL, _HEAD, _Source, receipt
worker, n = sys.argv[1], int(sys.argv[2])
with Endpoint.connect(worker, job="probe", rank=0) as ep:
    ch = ep.channel("A", 0, PROBE_CHANNEL)
    src, nbytes, first = _Source(n), 0, None
    for _ in range(n):
        parts = ch.recv_parts(timeout_s=60)
        first = first or time.monotonic()
        src.add(_HEAD.unpack(bytes(parts[0][:_HEAD.size]))[0])
        nbytes += sum(len(p) for p in parts)
        time.sleep(0.05)  # the application takes 20 messages a second
    print(nbytes * 8 / (time.monotonic() - first) / 1e6, flush=True)
    ch.send(receipt(src, nbytes, first, time.monotonic()))
    ep.flush(30)
"""


@pytest.mark.root
def test_the_probe_sender_reports_what_its_receiver_took(procs, tmp_path):
    """A receiver that takes its messages slowly: the sender's rate is the receiver's, not the rate at which its
    messages reached the receiving process (which holds up to its window unread)."""
    n, size = 20, 65536
    with Sites(["A", "B"]) as sites:
        try:
            fed = LocalFederation(tmp_path / "fed", ["A", "B"], procs=procs, sites=sites)
            rx = procs.start(sites.argv("B", [sys.executable, "-c", _SLOW_RECEIVER, fed.worker("B"), str(n)]))
            out = subprocess.run(sites.argv("A", [sys.executable, "-m", "switch_server.cli", "probe", "--config",
                                                  str(fed.switch_yaml("A")), "--send", "--to", "B", "--count",
                                                  str(n), "--bytes", str(size)]),
                                 capture_output=True, text=True, timeout=120)
            took, _ = rx.communicate(timeout=60)
        finally:
            procs.reap()
    assert out.returncode == 0 and rx.returncode == 0, out.stderr + took
    sent = json.loads(out.stdout.strip().splitlines()[-1])
    assert sent["received"] == n and sent["bytes"] == n * size
    assert sent["mbit_s"] <= float(took.split()[-1]) * 1.05  # (its span holds the receiver's, plus one-way latency)
