"""SIGTERM ends an OWL or FedOptima run cleanly: real `nebula fl start` processes (the server in A, a client in B)
behind real TLS switch servers are sent SIGTERM mid-run; each actor writes its `fl.stop` record (outcome stopped)
and its closing checkpoint, `nebula-admin audit verify` finds every log intact, and the process exits 0."""
from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from nebula.federated.actors import audit_dir
from nebula.federated.config import load_federated_job
from nebula.federated.runfiles import RunFiles
from testbed.federation import BIN, start_switches

BLOCKS = {  # runs far longer than the test waits: SIGTERM comes while they train
    "owl": ("towers_task", dict(rounds=10_000, local_steps=2, num_groups=1, round_timeout_s=60, peer_timeout_s=30)),
    "fedoptima": ("blobs_task", dict(omega=2, local_iterations=4, max_rounds=10_000, duration_s=600, split=2,
                                     join_timeout_s=60, idle_timeout_s=60, global_timeout_s=30)),
}


def _records(log: Path) -> list[dict]:
    return [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []


def _wait(cond, timeout_s: float, what: str) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.mark.parametrize("algorithm", sorted(BLOCKS))
def test_sigterm_ends_owl_and_fedoptima_actors_with_their_stop_record_and_checkpoint(procs, tmp_path, algorithm):
    workers = start_switches(procs, tmp_path / "fed", ["A", "B"])
    task, block = BLOCKS[algorithm]
    doc = {"job": "sig", "mode": "federated", "controller": {"cluster": "A", "dir": str(tmp_path / "fl")},
           "algorithm": algorithm, "startup_timeout_s": 60, "task": f"tests.federated.fedoptima_task:{task}",
           "clusters": [{"id": "A", "worker": str(workers["A"]), "num_clients": 0},
                        {"id": "B", "worker": str(workers["B"]), "num_clients": 1}], algorithm: block}
    job_file = tmp_path / "sig.yaml"
    job_file.write_text(yaml.safe_dump(doc))
    job = load_federated_job(job_file)
    start = [str(BIN / "nebula"), "fl", "start", str(job_file), "--cluster"]
    server = procs.start([*start, "A", "--role", "controller"])
    client = procs.start([*start, "B", "--role", "client", "--index", "0"])
    logs = {server: audit_dir(job, "A", 0) / "audit.log", client: audit_dir(job, "B", 2) / "audit.log"}
    status = RunFiles(job.controller.dir).status_path
    # training under way: both actors started (their SIGTERM handler is in place) and the server running
    _wait(lambda: all(_records(f)[:1] and _records(f)[0]["action"] == "fl.start" for f in logs.values())
          and status.exists() and json.loads(status.read_text())["state"] == "running", 120, "both actors to start")
    for p in (client, server):
        p.send_signal(signal.SIGTERM)
    for p, log in logs.items():
        out, _ = p.communicate(timeout=60)
        assert p.returncode == 0, out
        assert '"ended": "SIGTERM"' in out.split("RESULT ", 1)[1], out
        records = _records(log)
        assert [r["action"] for r in records[-2:]] == ["fl.stop", "audit.checkpoint"], records[-3:]
        assert records[-2]["outcome"] == "stopped" and records[-2]["detail"]["ended"] == "SIGTERM", records[-2]
        v = subprocess.run([str(BIN / "nebula-admin"), "audit", "verify", "--log", str(log)], capture_output=True,
                           text=True, timeout=60)
        assert v.returncode == 0 and v.stdout.startswith("OK"), (v.stdout, v.stderr)
    assert json.loads(status.read_text())["state"] == "stopped"
