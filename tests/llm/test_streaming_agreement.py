"""Streaming DiLoCo through real switch servers agrees with the one-process quality engine: a tiny PaddleFormers
Llama trained by `nebula launch` in two clusters (mode data_parallel, int8 slices, two fragments, one step of
delay) ends at the held-out loss `nebula.quality.engine.Bench` computes for row streaming-diloco, and sends the
engine's WAN bytes plus one message header per slice sent."""
from __future__ import annotations

import numpy as np
import pytest

from nebula.pipeline import read_metrics
from testbed.federation import finish, launch, start_switches
from tests.llm.conftest import NEEDS_FORMERS, SEQ_LEN, llm_job

pytestmark = NEEDS_FORMERS

STEPS, H, F, TAU, BATCH, LR = 12, 4, 2, 1, 8, 0.003  # BATCH: one step's examples over both clusters
HEADER_MAX = 200  # bytes of one slice's JSON header (run, seq, examples, tensor name and size): ~100


def _final_model(bench, ckpt_dir, seed):
    import paddle

    from nebula.quality.evaluate import build_full

    model = build_full(bench.layered, seed)
    files = sorted(ckpt_dir.glob(f"step_{STEPS:08d}/*/model.pdparams"))
    assert len(files) == 1, files  # one stage holding every layer, named as the full model's
    model.set_state_dict(paddle.load(str(files[0])))
    model.eval()
    return model


def test_streaming_diloco_through_switches_matches_the_quality_engine(procs, tmp_path, llama_dir, corpus_file):
    from nebula.quality.engine import Bench, Budget
    from nebula.quality.evaluate import heldout_loss
    from nebula.quality.rows import RowSpec

    heldout = tmp_path / "heldout.txt"
    heldout.write_text("\n".join(corpus_file.read_text(encoding="utf-8").splitlines()[::3]) + "\n",
                       encoding="utf-8")
    workers = start_switches(procs, tmp_path / "fed", ["A", "B"])
    clusters = [{"id": c, "worker": str(workers[c])} for c in "AB"]
    dp = {"sync_every": H, "outer": {"algorithm": "diloco", "lr": 0.7, "momentum": 0.9, "codec": "int8"},
          "streaming": {"fragments": F, "delay": TAU, "merge_alpha": 0.5}}
    job = llm_job(tmp_path, llama_dir, corpus_file, steps=STEPS, global_batch=BATCH // 2, micro_batches=1,
                  clusters=clusters, recipe_args={"num_stages": 1, "lr": LR}, mode="data_parallel",
                  checkpoint={"dir": "ckpt"}, peer_timeout_s=60, data_parallel=dp)
    pa, pb = launch(procs, job, "A"), launch(procs, job, "B")
    (ca, oa), (cb, ob) = finish(pa, 300), finish(pb, 300)
    assert ca == 0 and cb == 0, oa[-3000:] + ob[-3000:]
    recs = {c: read_metrics(tmp_path / "metrics" / f"{c}.rank0.jsonl") for c in "AB"}
    # slice 0 after steps 2, 6, 10, slice 1 after 4, 8, every slice after the last; each merged a step later
    assert [(r["step"] + 1, r["fragments_sent"]) for r in recs["A"] if r["synced"]] == \
        [(2, [0]), (4, [1]), (6, [0]), (8, [1]), (10, [0]), (12, [0, 1])]
    assert [r["step"] + 1 for r in recs["A"] if r["fragments_merged"]] == [3, 5, 7, 9, 11, 12]
    posts = sum(len(r["fragments_sent"]) for rs in recs.values() for r in rs)

    bench = Bench(llama_dir, corpus_file, heldout, seq_len=SEQ_LEN, lr=LR)
    row = bench.run(RowSpec("streaming-diloco", codec="int8", sync_every=H, fragments=F, delay=TAU),
                    Budget(steps=STEPS, global_batch=BATCH, seq_len=SEQ_LEN, lr=LR, seed=1, outer_lr=0.7,
                           outer_momentum=0.9, merge_alpha=0.5))
    models = {c: _final_model(bench, tmp_path / "ckpt" / c, 1) for c in "AB"}
    for (k, a), b in zip(models["A"].state_dict().items(), models["B"].state_dict().values()):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=k)  # the last step syncs every slice
    loss = heldout_loss(models["A"], bench.layered, bench.heldout)
    assert loss == pytest.approx(row.heldout_loss, abs=1e-5), (loss, row.heldout_loss)
    wan = sum(int(r["bytes_sent"]) for rs in recs.values() for r in rs)
    assert row.wan_bytes <= wan <= row.wan_bytes + posts * HEADER_MAX, (wan, row.wan_bytes, posts)
    peak = max(int(r["bytes_sent"]) for rs in recs.values() for r in rs[:-1])  # one slice, outside the last step
    assert peak < 0.6 * max(int(r["bytes_sent"]) for r in recs["A"][-1:])  # the last step sends both slices
