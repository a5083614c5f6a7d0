"""`nebula fl start|status|stop` run the job file's `algorithm:` (FedOptima, OWL) through real TLS switch servers,
one process per cluster; the model learns and `nebula fl status` names the algorithm and its result."""
from __future__ import annotations

import json

import pytest
import yaml

from nebula.cli import main
from testbed.federation import BIN, start_switches, wait_until

BLOCKS = {
    "fedoptima": {"omega": 2, "local_iterations": 4, "max_rounds": 12, "duration_s": 60, "lr_device": 0.1,
                  "lr_server": 0.1, "join_timeout_s": 30, "idle_timeout_s": 20, "global_timeout_s": 10,
                  "slowdown": [1, 3]},
    "owl": {"rounds": 4, "local_steps": 8, "lr": 0.1, "round_timeout_s": 60, "peer_timeout_s": 30},
}


def _job(tmp_path, workers, algorithm: str) -> str:
    doc = {"job": f"modes-{algorithm}", "mode": "federated", "controller": {"cluster": "A", "dir": f"fl-{algorithm}"},
           "clusters": [{"id": "A", "worker": str(workers["A"]), "num_clients": 0},
                        {"id": "B", "worker": str(workers["B"]), "num_clients": 2}],
           "startup_timeout_s": 60, "algorithm": algorithm,
           "task": f"tests.federated.fedoptima_task:{'blobs' if algorithm == 'fedoptima' else 'towers'}_task",
           algorithm: BLOCKS[algorithm]}
    f = tmp_path / f"{algorithm}.yaml"
    f.write_text(yaml.safe_dump(doc))
    return str(f)


def _fl(*argv: str, capsys) -> tuple[int, str, str]:
    code = main(["fl", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _result(p, timeout_s: float) -> dict:
    out, _ = p.communicate(timeout=timeout_s)
    assert p.returncode == 0, out[-3000:]
    return json.loads(out.split("RESULT ", 1)[1].splitlines()[0])


@pytest.mark.parametrize("algorithm", ["fedoptima", "owl"])
def test_fl_start_runs_the_job_files_algorithm_and_status_reports_it(procs, tmp_path, capsys, algorithm):
    workers = start_switches(procs, tmp_path / "fed", ["A", "B"])
    job = _job(tmp_path, workers, algorithm)
    code, out, _ = _fl("status", job, capsys=capsys)
    assert code == 0 and f"({algorithm}): not started" in out
    pa = procs.start([str(BIN / "nebula"), "fl", "start", job, "--cluster", "A"])
    pb = procs.start([str(BIN / "nebula"), "fl", "start", job, "--cluster", "B"])
    srv = _result(pa, 240)["server"]
    assert set(_result(pb, 60)) == {"B/2", "B/3"}
    # it learns: held-out accuracy against the same model untrained (four classes: chance is 0.25)
    assert srv["accuracy"] >= 0.8 and srv["accuracy"] >= srv["initial_accuracy"] + 0.3, srv
    if algorithm == "fedoptima":
        assert srv["ended"] == "12 rounds" and srv["peak_held"] <= 2 and set(srv["devices"]) == {"B/2", "B/3"}
    else:
        assert len(srv["round_s"]) == 4 and srv["num_groups"] >= 1
    code, out, _ = _fl("status", job, "--json", capsys=capsys)
    doc = json.loads(out)
    assert code == 0 and doc["algorithm"] == algorithm and doc["state"] == "finished"
    assert doc["result"]["accuracy"] == pytest.approx(srv["accuracy"])


def test_fl_start_refuses_a_mode_job_without_a_task_or_with_a_combiner_role(tmp_path, capsys):
    workers = {"A": tmp_path / "a.yaml", "B": tmp_path / "b.yaml"}
    job = _job(tmp_path, workers, "fedoptima")
    code, _, err = _fl("start", job, "--cluster", "A", "--role", "combiner", capsys=capsys)
    assert code == 2 and "has no combiner" in err
    doc = yaml.safe_load(open(job))
    del doc["task"]
    (tmp_path / "notask.yaml").write_text(yaml.safe_dump(doc))
    code, _, err = _fl("start", str(tmp_path / "notask.yaml"), "--cluster", "A", capsys=capsys)
    assert code == 2 and "needs `task: module:factory`" in err


def test_fl_stop_ends_a_fedoptima_run_early(procs, tmp_path, capsys):
    workers = start_switches(procs, tmp_path / "fed", ["A", "B"])
    job = _job(tmp_path, workers, "fedoptima")
    doc = yaml.safe_load(open(job))
    doc["fedoptima"] |= {"max_rounds": 100000, "duration_s": 600}  # only the stop can end it in time
    (tmp_path / "long.yaml").write_text(yaml.safe_dump(doc))
    job = str(tmp_path / "long.yaml")
    pa = procs.start([str(BIN / "nebula"), "fl", "start", job, "--cluster", "A"])
    pb = procs.start([str(BIN / "nebula"), "fl", "start", job, "--cluster", "B"])
    wait_until(lambda: json.loads(_fl("status", job, "--json", capsys=capsys)[1])["state"] == "running", 120,
               "the fedoptima server to run")
    assert _fl("stop", job, capsys=capsys)[0] == 0
    srv = _result(pa, 120)["server"]
    _result(pb, 60)
    assert srv["ended"] == "stop asked" and srv["wall_s"] < 300
    code, out, _ = _fl("status", job, "--json", capsys=capsys)
    assert json.loads(out)["state"] == "stopped"
