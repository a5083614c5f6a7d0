"""nebula-switch status and probe against real switches; Prometheus metrics; bad config fails closed."""
from __future__ import annotations

import json
import subprocess
import urllib.request
from pathlib import Path

import pytest

from security.provision import provision
from switch_server.cli import main
from testbed.federation import edit_yaml, start_switch, wait_until


def test_probe_status_and_metrics(two_switches, procs, capsys):
    fed, a, b = two_switches
    recv = procs.python("-m", "switch_server.cli", "probe", "--config", str(b.config), "--recv", "--count", "40",
                        "--timeout", "60")
    assert main(["probe", "--config", str(a.config), "--send", "--to", "B", "--count", "40", "--bytes", "20000"]) == 0
    sent = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert sent["sent"] == 40 and sent["mbit_s"] > 0
    out, _ = recv.communicate(timeout=60)
    result = json.loads(out.strip().splitlines()[-1])
    assert result["received"] == 40 and result["missing"] == 0 and result["duplicates"] == 0
    assert result["out_of_order"] == 0 and result["mbit_s"] > 0
    assert recv.returncode == 0

    def counted() -> bool:  # the status file (rewritten every second) counts the probe's bytes
        assert main(["status", "--config", str(a.config), "--json"]) == 0
        link = json.loads(capsys.readouterr().out)["links"].get("B", {})
        return link.get("up", False) and link.get("bytes_out", 0) >= 40 * 20000

    wait_until(counted, 30, "A's status to count the probe's bytes")
    assert main(["status", "--config", str(a.config)]) == 0
    text = capsys.readouterr().out
    assert "switch A" in text and "B" in text and " up " in text
    assert main(["status", "--config", str(a.config), "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["links"]["B"]["up"] and st["links"]["B"]["bytes_out"] >= 40 * 20000
    metrics = urllib.request.urlopen(f"http://{st['metrics']}/metrics", timeout=10).read().decode()
    sample = 'nebula_switch_bytes_total{direction="out",lane="activation",peer="B"} '
    line = next(ln for ln in metrics.splitlines() if ln.startswith(sample))
    assert float(line[len(sample):]) >= 40 * 20000  # every relayed byte is counted
    assert st["local_ipc"].startswith("ipc://@") and f"ipc {st['local_ipc']}" in text
    assert 'nebula_switch_link_up{peer="B"} 1.0' in metrics
    assert "nebula_switch_certificate_expiry_seconds" in metrics and "nebula_switch_rtt_seconds" in metrics


def test_bad_config_fails_closed(federation, capsys, tmp_path):
    cfg = Path(federation["clusters"]["A"]["switch_yaml"])
    edit_yaml(cfg, lambda d: d["tls"].update(crl=str(tmp_path / "missing-crl.pem")))
    assert main(["serve", "--config", str(cfg)]) == 2
    assert "missing-crl.pem" in capsys.readouterr().err
    edit_yaml(cfg, lambda d: d.update(bogus=1))
    assert main(["serve", "--config", str(cfg)]) == 2
    assert "unknown key bogus" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["probe", "--config", str(cfg)])


def test_probe_recv_counts_each_sender_apart(procs, tmp_path):
    """Clusters A and B each send 200 probe messages to C at once: C reports every one, per sender and in total."""
    fed = provision("fed3", ["A", "B", "C"], tmp_path / "fed3")
    cfg = {c: Path(fed["clusters"][c]["switch_yaml"]) for c in ("A", "B", "C")}
    switches = {c: start_switch(procs, cfg[c]) for c in ("A", "B", "C")}
    recv = procs.python("-m", "switch_server.cli", "probe", "--config", str(cfg["C"]), "--recv", "--count", "400",
                        "--timeout", "60")
    senders = [procs.python("-m", "switch_server.cli", "probe", "--config", str(cfg[c]), "--send", "--to", "C",
                            "--count", "200", "--bytes", "2000", "--timeout", "60") for c in ("A", "B")]
    for name, s in zip("AB", senders):
        try:
            out, _ = s.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            for p in (*senders, recv):
                p.kill()
            told = {n: p.communicate()[0][-3000:] for n, p in (("sender A", senders[0]), ("sender B", senders[1]),
                                                               ("receiver C", recv))}
            raise AssertionError(f"sender {name} still running after 90 s: {told}") from None
        assert s.returncode == 0, out
    out, _ = recv.communicate(timeout=90)
    result = json.loads(out.strip().splitlines()[-1])
    assert (result["received"], result["missing"], result["duplicates"]) == (400, 0, 0), result
    assert result["peers"] == {f"{c}/0": {"received": 200, "missing": 0, "duplicates": 0, "out_of_order": 0}
                               for c in ("A", "B")}
    assert recv.returncode == 0
    assert all(s.proc.poll() is None for s in switches.values())
