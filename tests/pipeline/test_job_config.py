"""Job file validation: every bad input is refused with a message naming the problem, before anything starts."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from nebula.config.schema import ConfigError

from nebula.config.job import load_job_config
from nebula.launch.preflight import validate_job
from tests.pipeline.helpers import TWO_STAGES, toy_job

NEBULA = str(Path(sys.executable).parent / "nebula")


def _two(tmp_path, **kw):
    return toy_job(tmp_path, clusters=[{"id": "A", "procs_per_node": 2}, {"id": "B", "procs_per_node": 2}],
                   stages=TWO_STAGES, **kw)


def test_valid_job_resolves_paths_and_segments(tmp_path):
    (tmp_path / "w").mkdir()
    f = toy_job(tmp_path, clusters=[{"id": "A", "worker": "w/a.yaml"}, {"id": "B", "worker": "w/b.yaml"}],
                stages=TWO_STAGES, checkpoint={"dir": "ck", "every": 2})
    cfg = load_job_config(f)
    assert cfg.segments == (("A", ("embed",)), ("B", ("head",)))
    assert cfg.inter_cluster
    assert cfg.cluster("A").worker == str(tmp_path / "w" / "a.yaml")
    assert cfg.checkpoint.dir == str(tmp_path / "ck")
    intra = cfg.intra("B")
    assert intra.segments == (("B", ("embed", "head")),) and not intra.inter_cluster
    assert cfg.compression.spec_at("forward", 0) == "none"


def test_stages_that_do_not_fit_the_model(tmp_path):
    f = toy_job(tmp_path, clusters=[{"id": "A"}], stages=[{"name": "embed", "cluster": "A"},
                                                          {"name": "decoder", "cluster": "A"}])
    with pytest.raises(ConfigError, match=r"do not fit the model.*\['embed', 'head'\]"):
        validate_job(load_job_config(f))


def test_stage_on_unknown_cluster_and_cluster_visited_twice(tmp_path):
    f = toy_job(tmp_path, clusters=[{"id": "A"}], stages=TWO_STAGES)
    with pytest.raises(ConfigError, match="stage 'head' runs on cluster 'B', which is not under clusters"):
        load_job_config(f)
    f = toy_job(tmp_path, clusters=[{"id": "A"}, {"id": "B"}], recipe_args={"num_stages": 3},
                stages=[{"name": "embed", "cluster": "A"}, {"name": "mid1", "cluster": "B"},
                        {"name": "head", "cluster": "A"}])
    with pytest.raises(ConfigError, match="visit a cluster twice"):
        load_job_config(f)


def test_clusters_without_a_switch(tmp_path):
    cfg = load_job_config(_two(tmp_path))
    with pytest.raises(ConfigError, match="cluster 'A' has no switch: set clusters\\[A\\].worker"):
        validate_job(cfg, "A")
    f = toy_job(tmp_path, clusters=[{"id": "A", "worker": "nope/worker.yaml"}, {"id": "B", "worker": "x.yaml"}],
                stages=TWO_STAGES)
    with pytest.raises(ConfigError, match="switch connection file .*nope/worker.yaml does not exist"):
        validate_job(load_job_config(f), "A")


def test_ranks_that_do_not_pair_up(tmp_path):
    f = toy_job(tmp_path, clusters=[{"id": "A", "procs_per_node": 2}, {"id": "B", "procs_per_node": 3}],
                stages=TWO_STAGES)
    with pytest.raises(ConfigError, match="ranks do not pair up.*A=2, B=3"):
        load_job_config(f)
    f = toy_job(tmp_path, clusters=[{"id": "A", "procs_per_node": 1}, {"id": "B", "procs_per_node": 3}],
                stages=[{"name": "gen", "cluster": "A"}, {"name": "disc", "cluster": "B"}],
                mode="oneway", oneway={"k": 4}, recipe_args={"oneway": True})
    with pytest.raises(ConfigError, match="oneway.k=4 needs cluster B to have 4 ranks.*larger than the ranks"):
        load_job_config(f)
    f = _two(tmp_path, global_batch=10)
    with pytest.raises(ConfigError, match="global_batch=10 must divide evenly over 2 ranks x 2 micro-batches"):
        load_job_config(f)


def test_unknown_keys_devices_and_cluster_names(tmp_path):
    f = _two(tmp_path, checkpont={"dir": "x"})
    with pytest.raises(ConfigError, match="unknown key checkpont"):
        load_job_config(f)
    f = toy_job(tmp_path, clusters=[{"id": "A", "device": "tpu"}, {"id": "B"}], stages=TWO_STAGES)
    with pytest.raises(ConfigError, match="clusters\\[0\\].device: 'tpu' is not one of"):
        load_job_config(f)
    cfg = load_job_config(toy_job(tmp_path, clusters=[{"id": "A"}], stages=[
        {"name": "embed", "cluster": "A"}, {"name": "head", "cluster": "A"}]))
    with pytest.raises(ConfigError, match="cluster 'Z' runs no stage"):
        validate_job(cfg, "Z")


def test_unknown_codec_is_refused(tmp_path):
    (tmp_path / "a.yaml").write_text("x: 1\n")
    (tmp_path / "b.yaml").write_text("x: 1\n")
    f = toy_job(tmp_path, clusters=[{"id": "A", "worker": "a.yaml"}, {"id": "B", "worker": "b.yaml"}],
                stages=TWO_STAGES, compression={"forward": "zstd9000", "backward": "none"})
    with pytest.raises(ConfigError, match=r"compression.forward='zstd9000' is not a valid codec spec.*known"):
        load_job_config(f)


def test_cli_refuses_bad_job_before_starting_anything(tmp_path):
    f = toy_job(tmp_path, clusters=[{"id": "A", "procs_per_node": 2}, {"id": "B", "procs_per_node": 1}],
                stages=TWO_STAGES)
    out = subprocess.run([NEBULA, "launch", str(f), "--cluster", "A"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "invalid job" in out.stderr and "ranks do not pair up" in out.stderr
    assert not (tmp_path / "metrics").exists()  # nothing was started


def test_cli_check_prints_the_paddle_launch_command(tmp_path):
    f = toy_job(tmp_path, clusters=[{"id": "A", "procs_per_node": 2}], stages=[
        {"name": "embed", "cluster": "A"}, {"name": "head", "cluster": "A"}])
    out = subprocess.run([NEBULA, "launch", str(f), "--cluster", "A", "--check"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "-m paddle.distributed.launch --nnodes 1 --nproc_per_node 2" in out.stdout
    assert "worker.py --job" in out.stdout and "--cluster A" in out.stdout


def test_hot_start_checkpoint_must_exist(tmp_path):
    f = toy_job(tmp_path, clusters=[{"id": "A"}], stages=[{"name": "embed", "cluster": "A"},
                                                          {"name": "head", "cluster": "A"}],
                checkpoint={"init_from": "ckpt/step_00000100"})
    with pytest.raises(ConfigError, match="checkpoint.init_from: .*step_00000100 is not a checkpoint step directory"):
        validate_job(load_job_config(f), "A")


def test_compression_starts_at_its_start_step():
    from nebula.config.job import CompressionConfig

    spec = CompressionConfig(forward="fp16(svd(0.6))", backward="int8", start_step=5)
    assert [spec.spec_at("forward", s) for s in (0, 4, 5, 9)] == ["none", "none", "fp16(svd(0.6))", "fp16(svd(0.6))"]
    assert spec.spec_at("backward", 5) == "int8" and spec.spec_at("backward", 4) == "none"
    with pytest.raises(ValueError, match="start_step = -1 must be an integer >= 0"):
        CompressionConfig(start_step=-1)


def test_a_layer_pipeline_inside_a_cluster_is_refused_in_mode_oneway(tmp_path):
    """The mode is chosen in one place (nebula.modes): a cluster pipeline belongs to mode pipeline only."""
    f = toy_job(tmp_path, clusters=[{"id": "A", "procs_per_node": 2, "pipeline": {"num_stages": 2}}, {"id": "B"}],
                stages=TWO_STAGES, mode="oneway")
    with pytest.raises(ConfigError, match=r"cluster A has a pipeline: .* runs in mode pipeline; remove "
                                          r"clusters\[A\].pipeline"):
        load_job_config(f)
