"""The runtime inside one process (intra-cluster mode): training learns, resume and hot start are exact."""
from __future__ import annotations

import dataclasses

import pytest

from nebula.config.job import load_job_config
from nebula.pipeline import read_metrics, replace_steps
from nebula.modes import run
from nebula.pipeline.checkpoint import local_steps
from tests.pipeline.helpers import toy_job

STAGES3 = [{"name": "embed", "cluster": "A"}, {"name": "mid1", "cluster": "A"}, {"name": "head", "cluster": "A"}]


@pytest.fixture
def job(tmp_path):
    return load_job_config(toy_job(tmp_path, clusters=[{"id": "A"}], stages=STAGES3, steps=6,
                                   recipe_args={"num_stages": 3}))


def _with_ckpt(cfg, tmp_path, sub, **kw):
    ck = dataclasses.replace(cfg.checkpoint, dir=str(tmp_path / sub), **kw)
    return dataclasses.replace(cfg, checkpoint=ck)


def test_training_learns_and_writes_metrics(tmp_path, job):
    cfg = replace_steps(job, 40)
    res = run(cfg, "A")
    first, last = sum(res.losses[s] for s in range(5)) / 5, sum(res.losses[s] for s in range(35, 40)) / 5
    assert last < 0.8 * first, (first, last)
    recs = read_metrics(tmp_path / "metrics" / "A.rank0.jsonl")
    assert [r["step"] for r in recs] == list(range(40))
    assert all(r["compute_s"] > 0 and r["wait_s"] == 0 and r["bytes_sent"] == 0 for r in recs)


def test_resume_continues_exactly(tmp_path, job):
    ref = run(job, "A").losses
    part = _with_ckpt(replace_steps(job, 3), tmp_path, "ck", every=2)
    r1 = run(part, "A")
    assert r1.checkpoints == [2, 3] and local_steps(tmp_path / "ck", "A", ["embed", "mid1", "head"]) == [2, 3]
    r2 = run(replace_steps(part, 6), "A")
    assert r2.start_step == 3
    for s in range(3, 6):
        assert r2.losses[s] == pytest.approx(ref[s], rel=1e-6, abs=1e-7)


def test_hot_start_from_another_runs_checkpoint(tmp_path, job):
    ref = run(job, "A").losses
    run(_with_ckpt(replace_steps(job, 4), tmp_path, "pre"), "A")
    hot = _with_ckpt(job, tmp_path, "new", init_from=str(tmp_path / "pre" / "step_00000004"))
    res = run(hot, "A")
    assert res.start_step == 4 and sorted(res.losses) == [4, 5]
    for s in (4, 5):
        assert res.losses[s] == pytest.approx(ref[s], rel=1e-6, abs=1e-7)
    bad = _with_ckpt(job, tmp_path, "new2", init_from=str(tmp_path / "pre"))
    with pytest.raises(FileNotFoundError, match="not a checkpoint step directory"):
        run(bad, "A")
