"""The run modes: one registry, the mode of a job chosen in one place, each started by its own command."""
from __future__ import annotations

import pytest

from nebula.config.job import load_job_config
from nebula.federated.config import load_federated_job
from nebula.modes import MODES, mode_of, run, start
from testbed.fedjob import write_job
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


def test_mode_names_are_spelled_once_for_the_job_file_the_registry_and_the_launcher():
    import typing

    from nebula.config.job import JobConfig
    from nebula.config.modes import LAUNCHED, ModeName

    assert set(MODES.names()) == {m.value for m in ModeName}
    assert {n for n in MODES.names() if MODES.get(n).command == "launch"} == {m.value for m in LAUNCHED}
    assert typing.get_args(typing.get_type_hints(JobConfig)["mode"]) == tuple(m.value for m in LAUNCHED)


def test_a_cluster_alone_states_the_mode_its_ranks_run(tmp_path):
    """`--intra` and data_parallel's stage runner run the stages back to back in one cluster: mode pipeline, said by
    JobConfig.in_one_cluster, never by a caller rewriting `mode`."""
    oneway = load_job_config(toy_job(tmp_path, clusters=[{"id": "A"}, {"id": "B"}], stages=TWO_STAGES,
                                     mode="oneway", name="o.yaml"))
    alone = oneway.intra("B")
    assert mode_of(alone) == "pipeline" and alone.segments == (("B", ("embed", "head")),)
    assert oneway.mode == "oneway" and oneway.inter_cluster  # (the job itself is unchanged)
    dp = load_job_config(toy_job(tmp_path, clusters=[{"id": "A"}, {"id": "B"}], stages=[], mode="data_parallel",
                                 name="d.yaml"))
    assert mode_of(dp.intra("A")) == "data_parallel" and [c.id for c in dp.intra("A").clusters] == ["A"]
    local = dp.in_one_cluster("A", ["embed", "head"])
    assert mode_of(local) == "pipeline" and local.segments == (("A", ("embed", "head")),)
    with pytest.raises(ValueError, match="no cluster 'Z'"):
        dp.in_one_cluster("Z", ["embed"])


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
