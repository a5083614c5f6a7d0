"""The run modes: one registry, the mode of a job chosen in one place, each started by its own command."""
from __future__ import annotations

import pytest

from nebula.config.job import load_job_config
from nebula.federated.config import load_federated_job
from nebula.modes import MODES, mode_of, run, start
from tests.federated.harness import write_job
from tests.pipeline.helpers import TWO_STAGES, toy_job


def test_every_mode_is_registered_once_with_the_command_that_starts_it():
    assert MODES.names() == ["data_parallel", "federated", "fedoptima", "oneway", "owl", "pipeline"]
    assert {n: MODES.get(n).command for n in MODES.names()} == {
        "pipeline": "launch", "oneway": "launch", "data_parallel": "launch",
        "federated": "fl", "fedoptima": "fl", "owl": "fl"}
    with pytest.raises(ValueError, match="unknown run mode 'swarm'; known modes: data_parallel, federated, fedoptima"):
        MODES.get("swarm")
    with pytest.raises(ValueError, match="run mode name 'owl' registered twice"):
        MODES.add("owl", MODES.get("owl"))


def test_a_jobs_mode_comes_from_its_file(tmp_path):
    for mode in ("pipeline", "oneway"):
        f = toy_job(tmp_path, clusters=[{"id": "A"}, {"id": "B"}], stages=TWO_STAGES, mode=mode, name=f"{mode}.yaml")
        assert mode_of(load_job_config(f)) == mode
    worker = tmp_path / "w.yaml"
    for algorithm, mode in (("rounds", "federated"), ("fedoptima", "fedoptima"), ("owl", "owl")):
        extra = {} if algorithm == "rounds" else {"algorithm": algorithm, "task": "tests.federated.fedoptima_task:x"}
        job = load_federated_job(write_job(tmp_path, {"A": worker}, {"A": 1}, **extra))
        assert mode_of(job) == mode


def test_each_command_refuses_the_other_commands_modes(tmp_path):
    f = write_job(tmp_path, {"A": tmp_path / "w.yaml"}, {"A": 1})
    with pytest.raises(ValueError, match="is of mode federated: start it with `nebula fl start`"):
        run(load_federated_job(f), "A")
    pipeline = toy_job(tmp_path, clusters=[{"id": "A"}, {"id": "B"}], stages=TWO_STAGES, name="p.yaml", mode="pipeline")
    with pytest.raises(ValueError, match="mode 'pipeline' is not federated; start it with `nebula launch`"):
        start(pipeline, "A")
