"""`allocation:` in a two-cluster job: the cut comes from both clusters' measured profiles and the WAN link, and a
real run through switch servers trains on that cut."""
from __future__ import annotations

import numpy as np
import pytest

from nebula.config.job import load_job_config
from nebula.hybrid.plan import plan_clusters
from nebula.pipeline import read_metrics
from nebula.modes import run
from testbed.federation import BIN, finish, launch, start_switches
from tests.pipeline.helpers import TWO_STAGES, toy_job

LAYERS, STEPS = 6, 16


def _layers_in(stage_dir) -> int:
    """Layers a saved stage holds: one Linear weight per toy layer."""
    import paddle

    return sum(k.endswith("fc.weight") for k in paddle.load(str(stage_dir / "model.pdparams")))


@pytest.mark.slow
def test_two_clusters_train_on_the_cut_the_allocator_chose_from_their_profiles(procs, tmp_path):
    workers = start_switches(procs, tmp_path / "fed", ["A", "B"])
    job = toy_job(tmp_path, steps=STEPS, global_batch=32, stages=TWO_STAGES, peer_timeout_s=60, checkpoint={"dir": "ck"},
                  recipe_args={"num_layers": LAYERS, "hidden": 32},
                  clusters=[{"id": "A", "worker": str(workers["A"])}, {"id": "B", "worker": str(workers["B"])}],
                  allocation={"method": "optimal", "wan": {"latency_ms": 20, "rate_mbit": 50}})
    # each cluster benchmarks its ranks (nebula bench), writing profiles/<cluster>.yaml that allocation: reads
    benches = [procs.start([str(BIN / "nebula"), "bench", str(job), "--cluster", c, "--out",
                            str(tmp_path / "profiles" / f"{c}.yaml")], cwd=str(tmp_path)) for c in ("A", "B")]
    for p in benches:
        code, out = finish(p, 180)
        assert code == 0, out[-3000:]
    chosen = list(plan_clusters(load_job_config(job)).bounds)  # what the allocator makes of those profiles
    assert len(chosen) == 3 and chosen[0] == 0 and chosen[-1] == LAYERS

    pa, pb = launch(procs, job, "A"), launch(procs, job, "B")
    (ca, outa), (cb, outb) = finish(pa, 240), finish(pb, 240)
    assert ca == 0 and cb == 0, outa[-3000:] + outb[-3000:]
    for out in (outa, outb):  # both launchers' preflights made the same cut
        assert f"allocation optimal: layers cut at {chosen} between clusters ['A', 'B']" in out
    step = tmp_path / "ck" / f"step_{STEPS:08d}"  # the stages each cluster trained, as saved
    assert _layers_in(step / "embed") == chosen[1] and _layers_in(step / "head") == LAYERS - chosen[1]
    losses = [r["loss"] for r in read_metrics(tmp_path / "metrics" / "B.rank0.jsonl")]
    assert len(losses) == STEPS and np.mean(losses[-4:]) < 0.8 * np.mean(losses[:4])  # it learns
    # and exactly as the same cut in one process (codec none)
    (tmp_path / "ref").mkdir()
    ref = run(load_job_config(toy_job(tmp_path / "ref", steps=STEPS, global_batch=32, clusters=[{"id": "A"}],
                                      stages=[{"name": "embed", "cluster": "A"}, {"name": "head", "cluster": "A"}],
                                      recipe_args={"num_layers": LAYERS, "hidden": 32, "bounds": chosen})), "A")
    np.testing.assert_allclose(losses, [ref.losses[s] for s in range(STEPS)], rtol=1e-5, atol=1e-6)
