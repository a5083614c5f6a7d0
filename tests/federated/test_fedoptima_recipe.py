"""The federated recipe's task (gettext language identification) under `algorithm: fedoptima` and `algorithm: owl`
in the job file, one process per cluster through real switch servers; both learn on held-out messages."""
from __future__ import annotations

import json

import pytest
import yaml

from nebula.config.schema import ConfigError
from nebula.federated.config import load_federated_job
from testbed.federation import start_switches


def _job(tmp_path, workers, algorithm: str, block: dict) -> str:
    doc = {"job": f"langid-{algorithm}", "mode": "federated", "controller": {"cluster": "A", "dir": "fl"},
           "clusters": [{"id": "A", "worker": str(workers["A"]), "num_clients": 1},
                        {"id": "B", "worker": str(workers["B"]), "num_clients": 2}],
           "client": {"factory": "recipes.federated.client:make_client",
                      "args": {"data": str(tmp_path / "langid.npz"), "alpha": 0.3, "hidden": 32}},
           "algorithm": algorithm, "task": "recipes.federated.modes:LangIdTask", algorithm: block}
    f = tmp_path / f"{algorithm}.yaml"
    f.write_text(yaml.safe_dump(doc))
    return str(f)


def load_federated_modes(f):  # one schema: the job carries its algorithm and sections
    job = load_federated_job(f)
    return job, job


def _result(p, timeout_s: float) -> dict:
    out, _ = p.communicate(timeout=timeout_s)
    assert p.returncode == 0, out[-3000:]
    return json.loads(out.split("RESULT ", 1)[1].splitlines()[0])


def test_job_file_selects_the_mode_and_refuses_bad_blocks(tmp_path):
    workers = {"A": tmp_path / "a.yaml", "B": tmp_path / "b.yaml"}
    job, mode = load_federated_modes(_job(tmp_path, workers, "fedoptima", {"omega": 3, "slowdown": [1, 2, 4]}))
    assert mode.algorithm == "fedoptima" and mode.fedoptima.omega == 3 and mode.fedoptima.slowdown == (1, 2, 4)
    assert job.job == "langid-fedoptima" and [c.num_clients for c in job.clusters] == [1, 2]
    with pytest.raises(ConfigError, match="fedoptima.omega=0 must be a positive integer"):
        load_federated_modes(_job(tmp_path, workers, "fedoptima", {"omega": 0}))
    with pytest.raises(ConfigError, match="unknown key owl.groups"):
        load_federated_modes(_job(tmp_path, workers, "owl", {"groups": 2}))
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump({**yaml.safe_load(open(_job(tmp_path, workers, "owl", {}))), "algorithm": "swarm"}))
    with pytest.raises(ConfigError, match="algorithm='swarm' must be one of rounds, fedoptima, owl"):
        load_federated_modes(f)


@pytest.mark.slow
def test_recipe_task_learns_under_fedoptima_and_owl(procs, tmp_path):
    from recipes.federated.data import prepare

    prepare(tmp_path / "langid.npz", langs=("de", "fr", "es"), max_per_lang=400, test_per_mille=200)
    workers = start_switches(procs, tmp_path / "fed", ["A", "B"])
    runs = {"fedoptima": {"omega": 3, "local_iterations": 5, "max_rounds": 12, "lr_device": 0.1, "lr_server": 0.1,
                          "join_timeout_s": 60, "slowdown": [1, 1, 3]},
            "owl": {"rounds": 4, "local_steps": 8, "lr": 0.1, "round_timeout_s": 120, "peer_timeout_s": 60}}
    for algorithm, block in runs.items():
        job = _job(tmp_path, workers, algorithm, block)
        pa = procs.python("-m", "recipes.federated.modes", job, "--cluster", "A")
        pb = procs.python("-m", "recipes.federated.modes", job, "--cluster", "B")
        ra, rb = _result(pa, 240), _result(pb, 120)
        srv = ra["server"]
        assert srv["accuracy"] >= 0.7 and srv["accuracy"] >= srv["initial_accuracy"] + 0.3, (algorithm, srv)
        assert set(rb) == {"B/2", "B/3"} and "A/2" in ra
        if algorithm == "owl":  # a linear model is one group: the server sends it once per cluster and round
            g = srv["group_bytes"][0]
            assert srv["num_groups"] == 1 and all(2 * g <= e < 2.2 * g for e in srv["server_egress_bytes"])
