"""The quality benchmark's engine: every mode trains the same tiny Llama on the same tokens in one process, the WAN's
bytes are the codecs' frames, and each mode computes what it claims (all-reduce = one place, DiLoCo's outer step,
stale weights, FedAvg's rounds)."""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest

from tests.llm.conftest import NEEDS_FORMERS

pytestmark = NEEDS_FORMERS

STEPS = 6


@pytest.fixture(scope="module")
def bench(llama_dir: Path, corpus_file: Path, tmp_path_factory):
    from nebula.quality.engine import Bench

    heldout = tmp_path_factory.mktemp("heldout") / "heldout.txt"
    lines = corpus_file.read_text(encoding="utf-8").splitlines()
    heldout.write_text("\n".join(lines[::7]) + "\n", encoding="utf-8")
    return Bench(llama_dir, corpus_file, heldout, seq_len=24, lr=3e-3, heldout_examples=40)


def budget(**kw):
    from nebula.quality.engine import Budget

    return Budget(**{"steps": STEPS, "global_batch": 8, "seq_len": 24, "lr": 3e-3, **kw})


def run(bench, mode: str, **kw):
    from nebula.quality.rows import RowSpec

    b = kw.pop("b", None) or budget()
    return bench.run(RowSpec(mode, **kw), b)


def model_bytes(r) -> int:
    return r.params * 4


def test_one_cluster_learns_and_sends_nothing(bench):
    from nebula.quality.evaluate import build_full

    before = bench._eval(build_full(bench.layered, 1))
    r = run(bench, "one-cluster", b=budget(steps=12))
    assert r.heldout_loss < before - 0.05, (before, r.heldout_loss)
    assert r.wan_bytes == 0 and r.traffic.exchanges == 0
    assert r.tokens == 12 * 8 * 24 and math.isclose(r.perplexity, math.exp(r.heldout_loss))


def test_all_reduce_trains_what_one_place_trains_and_sends_every_gradient(bench):
    one = run(bench, "one-cluster")
    ar = run(bench, "all-reduce", codec="none")
    # the mean of the two clusters' gradients is the gradient of the whole batch (up to how padding weighs)
    assert ar.heldout_loss == pytest.approx(one.heldout_loss, rel=2e-3)
    assert ar.traffic.exchanges == STEPS
    # each cluster sends its whole float32 gradient every step (plus the frames' headers)
    assert model_bytes(ar) * 2 * STEPS <= ar.wan_bytes < model_bytes(ar) * 2 * STEPS * 1.05


def test_pipeline_sends_activations_and_int8_quarters_them(bench):
    none = run(bench, "pipeline", codec="none")
    int8 = run(bench, "pipeline", codec="int8")
    acts = 8 * 24 * 32 * 4  # global batch x seq_len x hidden, float32, once forward and once back per step
    assert 2 * acts * STEPS <= none.wan_bytes < 2 * acts * STEPS * 1.1
    assert none.wan_bytes / int8.wan_bytes > 3.5
    one = run(bench, "one-cluster")
    assert none.heldout_loss == pytest.approx(one.heldout_loss, rel=2e-3)  # a lossless cut changes nothing


def test_stale_weights_delay_the_upstream_update(bench):
    sync = run(bench, "pipeline", codec="none")
    stale = run(bench, "pipeline", codec="none", stale_weights=2)
    assert stale.traffic.overlapped and not sync.traffic.overlapped
    assert stale.wan_bytes == sync.wan_bytes
    assert stale.heldout_loss != sync.heldout_loss  # the same gradients, applied two steps late
    assert abs(stale.heldout_loss - sync.heldout_loss) < 0.2


def test_diloco_syncs_every_h_steps_with_compressed_pseudo_gradients(bench):
    none = run(bench, "diloco", codec="none", sync_every=3)
    int8 = run(bench, "diloco", codec="int8", sync_every=3)
    assert none.extra["syncs"] == 2 and none.traffic.exchanges == 2
    assert model_bytes(none) * 2 * 2 <= none.wan_bytes < model_bytes(none) * 2 * 2 * 1.05
    assert 3.5 < none.wan_bytes / int8.wan_bytes < 4.0
    assert none.peak_wan_bytes * 2 == none.wan_bytes  # one sync carries half the run's bytes
    assert none.heldout_loss != int8.heldout_loss


def test_diloco_averaging_every_step_stays_with_one_place(bench):
    # outer lr 1 without momentum is the mean of the replicas; after every step it keeps them one model, which
    # trains close to one place (the mean of two AdamW steps, not AdamW on the mean gradient)
    avg = run(bench, "diloco", sync_every=1, b=budget(outer_lr=1.0, outer_momentum=0.0))
    one = run(bench, "one-cluster")
    assert avg.extra["syncs"] == STEPS
    assert avg.heldout_loss == pytest.approx(one.heldout_loss, rel=0.02)


def test_federated_rounds_move_one_model_each_way(bench):
    r = run(bench, "federated", codec="none", sync_every=3)
    assert r.extra["rounds"] == 2 and r.traffic.latencies_per_exchange == 2
    assert model_bytes(r) * 2 * 2 <= r.wan_bytes < model_bytes(r) * 2 * 2 * 1.05


def test_rows_round_trip_through_json(bench, tmp_path):
    from nebula.quality.rows import read_rows, write_rows

    r = run(bench, "diloco", codec="int8", sync_every=3)
    write_rows(tmp_path / "rows.json", [r], meta={"size": "test"})
    back = read_rows(tmp_path / "rows.json")[0]
    assert back.spec == r.spec and back.heldout_loss == r.heldout_loss and back.traffic == r.traffic
    keys = set(json.loads((tmp_path / "rows.json").read_text())[0])
    assert {"mode", "codec", "sync_every", "heldout_loss", "wan_bytes", "wall_s"} <= keys

    # rows added to an earlier file keep the settings they were measured with; only the new ones get this run's
    write_rows(tmp_path / "more.json", [back, dataclasses.replace(r, seed=1)], meta={"size": "test", "outer_lr": 1.0})
    more = json.loads((tmp_path / "more.json").read_text())
    assert [d["meta"] for d in more] == [{"size": "test"}, {"size": "test", "outer_lr": 1.0}]


def test_rows_of_another_corpus_or_model_are_refused_not_compared(tmp_path):
    from nebula.quality.rows import RowResult, RowSpec, check_same_data, data_fingerprint

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"w" * 100)
    train, held = tmp_path / "train.txt", tmp_path / "heldout.txt"
    train.write_text("a b c\n")
    held.write_text("d e\n")
    fp = data_fingerprint(model, train, held)
    assert fp == data_fingerprint(model, train, held) and len(fp) == 16
    (model / "saved_signal_0").write_text("1")  # not what a row depends on
    assert data_fingerprint(model, train, held) == fp
    train.write_text("a b c d\n")  # the corpus built again: another fingerprint
    other = data_fingerprint(model, train, held)
    assert other != fp

    def row(name: str, data: str | None) -> RowResult:
        return RowResult(RowSpec("diloco", codec=name), 5.0, 1, 1.0, 1.0, 10, 100, 1000, 0,
                         meta={"data": data} if data else {})

    assert check_same_data([row("int8", fp), row("fp4", fp)], fp) == []
    assert check_same_data([row("int8", None), row("fp4", fp)], fp) == ["diloco H=1 int8"]
    with pytest.raises(ValueError, match=f"'diloco H=1 fp4' was measured on data {other} and 'diloco H=1 int8' on "
                                         f"{fp} .* run the rows again into a new file"):
        check_same_data([row("int8", fp), row("fp4", other)])
    with pytest.raises(ValueError, match="'this run'"):
        check_same_data([row("int8", other)], fp)


def test_bad_budgets_and_rows_say_what_to_change():
    from nebula.quality.engine import Budget
    from nebula.quality.rows import RowSpec

    with pytest.raises(ValueError, match="global_batch=6 must split evenly over micro_batches"):
        Budget(steps=2, global_batch=6, micro_batches=4)
    with pytest.raises(ValueError, match="stale_weights applies to mode pipeline"):
        RowSpec("diloco", stale_weights=1)
    with pytest.raises(ValueError, match="row mode 'ring' is not one of"):
        RowSpec("ring")


def test_streaming_diloco_sends_a_fragment_at_a_time_and_merges_late(bench):
    plain = run(bench, "diloco", codec="none", sync_every=6, b=budget(steps=12))
    stream = run(bench, "streaming-diloco", codec="none", sync_every=6, fragments=3, b=budget(steps=12))
    # each fragment crosses as often as the whole model does in plain DiLoCo, a third at a time at its own step;
    # the last step sends the two fragments not due then too, so the run ends on one agreed model
    assert plain.extra["syncs"] == 2 and stream.extra["syncs"] == 3 * 2 + 2
    # (a fragment is one frame; plain DiLoCo sends a frame per tensor, each with its header)
    assert stream.wan_bytes == pytest.approx(plain.wan_bytes * 8 / 6, rel=0.03)
    assert stream.peak_wan_bytes == pytest.approx(plain.peak_wan_bytes / 3, rel=0.03)
    late = run(bench, "streaming-diloco", codec="none", sync_every=6, fragments=3, delay=1, b=budget(steps=12))
    assert late.traffic.overlapped and not stream.traffic.overlapped
    assert late.heldout_loss != stream.heldout_loss and abs(late.heldout_loss - stream.heldout_loss) < 0.2
    with pytest.raises(ValueError, match="fragments=7 must be from 1 to data_parallel.sync_every"):
        run(bench, "streaming-diloco", sync_every=6, fragments=7)


def test_a_wire_keeps_error_feedback_per_tensor_as_the_runtime_does():
    from nebula.quality.engine import _Wire

    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(8, 8)).astype("float32"), rng.normal(size=(8, 8)).astype("float32")
    shared, own_a, own_b = _Wire("ef(int4_block)"), _Wire("ef(int4_block)"), _Wire("ef(int4_block)")
    for _ in range(3):  # two tensors of one shape: each keeps its own residual, as if sent on wires of their own
        assert np.array_equal(shared.send(a, "a")[0], own_a.send(a)[0])
        assert np.array_equal(shared.send(b, "b")[0], own_b.send(b)[0])
    assert shared.bytes == own_a.bytes + own_b.bytes
