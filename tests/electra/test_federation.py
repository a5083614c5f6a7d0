"""The ELECTRA recipe across clusters through real switch servers and real paddle.distributed.launch groups."""
from __future__ import annotations

import shutil
import time

import pytest

from nebula.config.job import load_job_config
from nebula.pipeline import read_metrics
from nebula.modes import run
from recipes.electra.prepare import distribute
from tests.electra.helpers import GEN_STAGES, electra_job, local_job
from testbed.federation import finish, launch, start_switches

HOT, END = 6, 12


@pytest.mark.slow
def test_three_clusters_hot_start_reproduce_intra_losses_with_token_ids_only_on_the_wan(corpus, procs, tmp_path):
    """Two generator clusters (1 rank each) feed a discriminator cluster of 2 ranks; the run hot-starts from an
    intra-cluster checkpoint, continues its losses exactly, and sends nothing but token ids."""
    intra_dir = tmp_path / "intra"
    ref = run(load_job_config(local_job(intra_dir, str(corpus), END, checkpoint={"dir": "ckpt", "every": HOT})),
              "L", workdir=intra_dir).losses
    assert ref[END - 1] < ref[0]
    distribute(corpus, tmp_path, {"G1": "romance", "G2": "slavic_cjk"}, "D")
    workers = start_switches(procs, tmp_path / "fed", ["G1", "G2", "D"], shape={"rate_mbit": 170, "delay_ms": 5})
    job = electra_job(tmp_path, data="{cluster}/data", steps=END, peer_timeout_s=60, oneway={"k": 1},
                      clusters=[{"id": "G1", "worker": str(workers["G1"])}, {"id": "G2", "worker": str(workers["G2"])},
                                {"id": "D", "procs_per_node": 2, "worker": str(workers["D"])}],
                      stages=[{"name": GEN_STAGES[0], "cluster": "G1"}, {"name": GEN_STAGES[1], "cluster": "G2"},
                              {"name": "disc", "cluster": "D"}],
                      checkpoint={"init_from": str(intra_dir / "ckpt" / f"step_{HOT:08d}")})
    ps = {c: launch(procs, job, c) for c in ("G1", "G2", "D")}
    outs = {c: finish(p, 300) for c, p in ps.items()}
    assert all(code == 0 for code, _ in outs.values()), {c: o[-2000:] for c, (_, o) in outs.items()}
    disc = read_metrics(tmp_path / "metrics" / "D.rank0.jsonl")
    assert [r["step"] for r in disc] == list(range(HOT, END))
    for r in disc:  # the inter-cluster run continues the intra-cluster curve: same loss at every step
        assert r["loss"] == pytest.approx(ref[r["step"]], rel=1e-4), (r["step"], r["loss"], ref[r["step"]])
    # (learning is the reference's, asserted above over all its steps: the 6 hot-started steps alone are too few
    # for their first and last loss to order the same way on every corpus)
    # what crossed the WAN: per step and generator, 8 rows of int16 token ids (<= 2 + 2 x 24 columns) plus framing
    ids_bytes = 8 * (2 + 2 * 24) * 2
    for g in ("G1", "G2"):
        recs = read_metrics(tmp_path / "metrics" / f"{g}.rank0.jsonl")
        assert [r["step"] for r in recs] == list(range(HOT, END))
        assert all(0 < r["bytes_sent"] <= ids_bytes + 400 for r in recs[1:]), [r["bytes_sent"] for r in recs]
        assert sum(r["bytes_recv"] for r in recs) < 300 * len(recs)  # sync tensors only, never gradients
    for rank in (0, 1):
        recs = read_metrics(tmp_path / "metrics" / f"D.rank{rank}.jsonl")
        assert all(r["bytes_sent"] < 400 for r in recs[1:])  # the 16-byte sync tensor and framing
        assert sum(r.get("n/en", 0) + r.get("n/ru", 0) for r in recs) > 0


@pytest.mark.slow
def test_different_vocabularies_stop_both_clusters_before_training(corpus, procs, tmp_path):
    distribute(corpus, tmp_path, {"G1": "romance"}, "D")
    other = tmp_path / "D" / "data" / "spm.model"
    other.write_bytes(other.read_bytes() + b"\0")  # another tokenizer file on the discriminator cluster
    workers = start_switches(procs, tmp_path / "fed", ["G1", "D"])
    job = electra_job(tmp_path, data="{cluster}/data", steps=4, peer_timeout_s=30, args={"groups": ["romance"]},
                      clusters=[{"id": "G1", "worker": str(workers["G1"])}, {"id": "D", "worker": str(workers["D"])}],
                      stages=[{"name": "gen_romance", "cluster": "G1"}, {"name": "disc", "cluster": "D"}])
    ps = {c: launch(procs, job, c) for c in ("G1", "D")}
    outs = {c: finish(p, 240) for c, p in ps.items()}
    for c, (code, out) in outs.items():
        assert code != 0, out[-2000:]
        assert "built differently (vocabulary:" in out and "same data directory / tokenizer" in out, out[-2000:]
    assert not list((tmp_path / "metrics").glob("*.jsonl")) or all(
        not read_metrics(f) for f in (tmp_path / "metrics").glob("*.jsonl"))


@pytest.mark.slow
def test_k_auto_feeds_a_slower_discriminator_and_its_death_stops_the_generator(corpus, procs, tmp_path):
    """k auto against a discriminator whose ranks take 0.3 s per micro-batch picks k = 2 (all its ranks); when the
    discriminator cluster is killed the generator cluster exits with a message instead of hanging."""
    distribute(corpus, tmp_path, {"G1": "romance"}, "D")
    workers = start_switches(procs, tmp_path / "fed", ["G1", "D"])
    job = electra_job(tmp_path, data="{cluster}/data", steps=200, peer_timeout_s=8, oneway={"k": "auto"},
                      args={"groups": ["romance"], "disc_delay_s": 0.3},
                      clusters=[{"id": "G1", "worker": str(workers["G1"])},
                                {"id": "D", "procs_per_node": 2, "worker": str(workers["D"])}],
                      stages=[{"name": "gen_romance", "cluster": "G1"}, {"name": "disc", "cluster": "D"}])
    g, d = launch(procs, job, "G1"), launch(procs, job, "D")
    sub = tmp_path / "metrics" / "D.rank1.jsonl"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and len(read_metrics(sub) if sub.is_file() else []) < 3:
        time.sleep(0.5)
    recs = read_metrics(sub)
    assert len(recs) >= 3 and recs[0]["k"] == 2  # rank 1 is fed by the root's scatter
    assert sum(r.get("n/es", 0) + r.get("n/en", 0) + r.get("n/it", 0) for r in recs) > 0
    assert all(r["bytes_recv"] == 0 for r in recs)  # nothing reaches a sub-discriminator over the WAN
    import os
    import signal

    os.killpg(d.pid, signal.SIGKILL)
    code, out = finish(g, 120)  # peer_timeout_s=8: a hang would run into this limit and fail the test
    assert code == 3 and "peer cluster D lost" in out and "Restart all clusters" in out, out[-2000:]
    shutil.rmtree(tmp_path / "fed", ignore_errors=True)
