"""A PaddleFormers Llama across two clusters through real switch servers, in all three cross-cluster modes:
pipeline (decoder layers split, parity with one process; int8 at the cut), data_parallel with DiLoCo, and
federated clients fine-tuning it."""
from __future__ import annotations

import numpy as np
import pytest

from nebula.config.job import load_job_config
from nebula.pipeline import read_metrics
from nebula.modes import run
from testbed.fedjob import run_job, write_job
from tests.llm.conftest import NEEDS_FORMERS, ONE_PROCESS, SEQ_LEN, TWO_CLUSTERS, llm_job
from testbed.federation import BIN, finish, launch, start_switches

pytestmark = NEEDS_FORMERS
STEPS = 6


def _both(procs, job, timeout_s=300) -> tuple[str, str]:
    pa, pb = launch(procs, job, "A"), launch(procs, job, "B")
    (ca, oa), (cb, ob) = finish(pa, timeout_s), finish(pb, timeout_s)
    assert ca == 0 and cb == 0, oa[-3000:] + ob[-3000:]
    return oa, ob


def _records(tmp_path, cluster, rank=0):
    return read_metrics(tmp_path / "metrics" / f"{cluster}.rank{rank}.jsonl")


def test_two_cluster_pipeline_without_compression_reproduces_the_one_process_losses(procs, tmp_path, llama_dir,
                                                                                     corpus_file):
    """Embeddings and two decoder layers in A, two decoder layers, norm and head in B, hidden states forward and
    their gradients back through TLS switch servers with codec none: every step's loss is the single process's."""
    workers = start_switches(procs, tmp_path / "fed", ["A", "B"])
    clusters = [{"id": c, "worker": str(workers[c])} for c in "AB"]
    job = llm_job(tmp_path, llama_dir, corpus_file, steps=STEPS, clusters=clusters, stages=TWO_CLUSTERS,
                  peer_timeout_s=60)
    _both(procs, job)
    ref = run(load_job_config(llm_job(tmp_path / "ref", llama_dir, corpus_file, steps=STEPS,
                                      clusters=[{"id": "A"}], stages=ONE_PROCESS)), "A").losses
    got = {r["step"]: r["loss"] for r in _records(tmp_path, "B")}
    assert sorted(got) == list(range(STEPS))
    for s in range(STEPS):
        assert got[s] == pytest.approx(ref[s], rel=1e-5, abs=1e-6), (s, got[s], ref[s])
    assert ref[STEPS - 1] < ref[0]
    hidden = 32 * 4 * SEQ_LEN * 4  # [4 examples per micro-batch, 24 tokens, 32] float32 per message
    sent = [r["bytes_sent"] for r in _records(tmp_path, "A")]
    assert sum(sent) >= STEPS * 2 * hidden


def test_data_parallel_diloco_on_int8_pseudo_gradients_learns_and_ends_with_one_model(procs, tmp_path, llama_dir,
                                                                                      corpus_file):
    workers = start_switches(procs, tmp_path / "fed", ["A", "B"])
    clusters = [{"id": c, "worker": str(workers[c])} for c in "AB"]
    job = llm_job(tmp_path, llama_dir, corpus_file, steps=8, micro_batches=1, clusters=clusters,
                  recipe_args={"num_stages": 1}, mode="data_parallel", checkpoint={"dir": "ckpt"}, peer_timeout_s=60,
                  data_parallel={"sync_every": 4, "outer": {"algorithm": "diloco", "lr": 0.7, "codec": "int8"}})
    _both(procs, job)
    a, b = ({r["step"]: r for r in _records(tmp_path, c)} for c in "AB")
    assert [s for s in range(8) if a[s]["synced"]] == [3, 7]
    first = np.mean([a[s]["loss"] + b[s]["loss"] for s in range(2)]) / 2
    last = np.mean([a[s]["loss"] + b[s]["loss"] for s in range(6, 8)]) / 2
    assert last < first - 0.3, (first, last)
    import paddle

    params = {c: {k: v.numpy() for f in sorted((tmp_path / "ckpt" / c).glob("step_00000008/*/model.pdparams"))
                  for k, v in paddle.load(str(f)).items()} for c in "AB"}
    raw = sum(v.size * 4 for v in params["A"].values())
    assert 0 < a[3]["bytes_sent"] < raw / 2  # int8: about a quarter of the float32 model crosses
    assert params["A"].keys() == params["B"].keys() and len(params["A"]) > 10
    for k in params["A"]:  # the last step syncs: both clusters hold the same model
        np.testing.assert_array_equal(params["A"][k], params["B"][k])


def test_federated_clients_fine_tune_it_and_the_global_model_improves(procs, tmp_path, llama_dir, corpus_file):
    workers = start_switches(procs, tmp_path / "prov", ["A", "B"])
    args = {"from_pretrained": str(llama_dir), "data": str(corpus_file), "seq_len": SEQ_LEN, "epochs": 1,
            "lr": 0.003, "batch_size": 8}
    job = write_job(tmp_path, workers, {"A": 1, "B": 1}, rounds=3, deadline_s=120, startup_timeout_s=120,
                    client={"factory": "nebula.formers:make_client", "args": args}, update_codec="ef(int8)")
    run_job(procs, job, timeout_s=300)
    from nebula.federated.controller.trail import ModelTrail

    with ModelTrail(tmp_path / "fl" / "trail") as t:
        models = t.models()
        w, _ = t.load(models[-1].version)
    assert [m.version for m in models] == [1, 2, 3, 4]
    # each round's clients evaluate the global model they were sent on their held-out lines
    losses = [m.metrics["parent_eval_loss"] for m in models[1:]]
    assert losses[-1] < losses[0] - 0.2, losses
    assert any(k.endswith("lm_head.weight") for k in w) and all(np.isfinite(v).all() for v in w.values())


@pytest.mark.slow
def test_two_ranks_per_cluster_int8_at_the_cut_on_the_allocators_cut(procs, tmp_path, llama_dir, corpus_file):
    """Each cluster benchmarks its ranks (nebula bench), the job's allocation: cuts the model's layers between the
    clusters from those profiles, and two ranks per cluster (each reading the checkpoint outside the job's process
    group) train through int8 at the cut."""
    workers = start_switches(procs, tmp_path / "fed", ["A", "B"])
    clusters = [{"id": c, "procs_per_node": 2, "worker": str(workers[c])} for c in "AB"]
    job = llm_job(tmp_path, llama_dir, corpus_file, steps=12, global_batch=16, clusters=clusters,
                  stages=TWO_CLUSTERS, peer_timeout_s=90, compression={"forward": "int8", "backward": "int8"},
                  allocation={"method": "optimal", "wan": {"latency_ms": 20, "rate_mbit": 50}})
    benches = [procs.start([str(BIN / "nebula"), "bench", str(job), "--cluster", c, "--out",
                            str(tmp_path / "profiles" / f"{c}.yaml")], cwd=str(tmp_path)) for c in "AB"]
    for p in benches:
        code, out = finish(p, 300)
        assert code == 0, out[-3000:]
    from nebula.hybrid.plan import plan_clusters

    chosen = list(plan_clusters(load_job_config(job)).bounds)
    oa, ob = _both(procs, job, 400)
    for out in (oa, ob):
        assert f"allocation optimal: layers cut at {chosen} between clusters ['A', 'B']" in out
    recs = _records(tmp_path, "B")
    assert np.mean([r["loss"] for r in recs[-3:]]) < np.mean([r["loss"] for r in recs[:3]]) - 0.3
    ref = run(load_job_config(llm_job(tmp_path / "ref", llama_dir, corpus_file, steps=12, global_batch=16,
                                      clusters=[{"id": "A"}], stages=ONE_PROCESS,
                                      recipe_args={"bounds": chosen})), "A").losses
    a = _records(tmp_path, "A")
    raw = sum(r["bytes_recv"] for r in a)  # int8 gradients back: about a quarter of float32 hidden states
    assert raw < 0.5 * 12 * 2 * (16 // 4) * SEQ_LEN * 32 * 4
    # int8 at the cut: near the uncompressed run, not equal to it
    assert abs(recs[-1]["loss"] - ref[11]) < 0.5
