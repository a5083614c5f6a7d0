"""Activation deltas on the pipeline runtime: each micro-batch's example ids reach the codec through the boundary,
the downstream end decodes with its own cache, gradients keep their codec, and a two-cluster run trains as closely
as without compression on fewer bytes."""
from __future__ import annotations

import queue

import numpy as np
import paddle
import pytest

from nebula.config.job import load_job_config
from nebula.pipeline import QueueLink, queue_pair, read_metrics
from nebula.pipeline.boundary import Boundary, recv_forward, send_forward
from tests.pipeline.helpers import TWO_STAGES, run_two_clusters, toy_job

DELTA = "delta(int2_block, first=int8_block, cache_mb=4)"


def _boundaries(forward: str, backward: str = "int8"):
    links = [queue_pair("A", "B") for _ in range(3)]
    codecs = {"forward": forward, "backward": backward}
    codec = lambda direction, step: codecs[direction]  # noqa: E731
    up = Boundary(side="upstream", act=links[0][0], grad=links[1][0], ctl=links[2][0], codec=codec,
                  peer_timeout_s=30)
    down = Boundary(side="downstream", act=links[0][1], grad=links[1][1], ctl=links[2][1], codec=codec,
                    peer_timeout_s=30)
    return up, down


@pytest.mark.parametrize("spec, first_of_raw, first_tol, delta_of_raw", [
    (DELTA, 1 / 3, 2e-2, 1 / 8),  # int8 first, 2-bit deltas
    # the benchmark's best row: 4-bit first (|error| <= max / 14 of tanh's range), 3-bit deltas Huffman-coded (at
    # 4,096 values the nested codec's JSON header and the example ids weigh in the message)
    ("delta(huffman(int3_block), first=huffman(int4_block), cache_mb=4)", 1 / 5, 1 / 14, 1 / 6)])
def test_boundary_sends_deltas_keyed_by_example_id_and_gradients_with_their_codec(spec, first_of_raw, first_tol,
                                                                                   delta_of_raw):
    paddle.seed(5)
    f, g = paddle.nn.Linear(256, 256), paddle.nn.Linear(256, 3)
    x = paddle.to_tensor(np.random.default_rng(0).standard_normal((16, 256)).astype("float32"))
    ids = np.arange(100, 116)
    up, down = _boundaries(spec)
    try:
        sent = []
        for step in range(3):  # the same 16 examples each step (three epochs of a 16-example set)
            before = up.stats.bytes_sent
            out = paddle.tanh(f(x))
            token = send_forward(out, up, (step, 0, 0), ids)
            h = recv_forward(down, (step, 0, 0))
            # a delta also carries the correction of the reference's own error: each step's error is a fraction of
            # the step's before, or the coarse codes' share of the drift
            tol = max(first_tol / 5 ** step, 3e-3 * (step + 1)) if step else first_tol
            np.testing.assert_allclose(h.numpy(), out.numpy(), atol=tol)
            (g(h) ** 2).mean().backward()
            token.backward()
            up.flush()
            down.flush()
            sent.append(up.stats.bytes_sent - before)
            assert f.weight.grad is not None and float(f.weight.grad.abs().sum()) > 0
            with paddle.no_grad():  # a small step: the activations drift as in training
                f.weight.set_value(f.weight - 0.001 * f.weight.grad)
            f.clear_gradients()
        raw = 16 * 256 * 4
        assert sent[0] < raw * first_of_raw and max(sent[1:]) < min(raw * delta_of_raw, sent[0]), sent
        assert up.cache_bytes == down.cache_bytes == raw  # both ends hold each example once, in float32
        assert 16 * 256 <= down.stats.bytes_sent < 3 * 16 * 256 * 2  # int8 gradients back
    finally:
        up.close()
        down.close()


def test_boundary_without_ids_fails_with_one_line():
    up, down = _boundaries(DELTA)
    try:
        send_forward(paddle.ones([2, 4]), up, (0, 0, 0))
        with pytest.raises(Exception, match="needs the sample id of each row") as info:
            up.flush()
        assert "\n" not in str(info.value)
    finally:
        up.close()
        down.close()


def _two_clusters(tmp_path, forward: str, sub: str):
    """Toy model embed (A) / head (B) in one process, 24 steps over a 64-example set (6 epochs)."""
    d = tmp_path / sub
    d.mkdir()
    job = toy_job(d, clusters=[{"id": "A"}, {"id": "B"}], stages=TWO_STAGES, steps=24, global_batch=16,
                  recipe_args={"hidden": 256, "num_examples": 64},
                  compression={"forward": forward, "backward": "int8"})
    cfg = load_job_config(job)
    wa, wb = {}, {}
    for kind in ("act", "grad", "ctl"):
        ab, ba = queue.Queue(), queue.Queue()
        wa[kind], wb[kind] = QueueLink(ab, ba, peer_cluster="B"), QueueLink(ba, ab, peer_cluster="A")
    _, res_b = run_two_clusters(cfg, {"next": wa}, {"prev": wb}, d, timeout_s=120)
    recs = read_metrics(d / "metrics" / "A.rank0.jsonl")
    cache = {r["cache_bytes"] for r in read_metrics(d / "metrics" / "B.rank0.jsonl")[4:]}
    assert cache == {64 * 256 * 4 if forward != "none" else 0}  # every example held once, float32, from epoch 2 on
    return res_b.losses, sum(r["bytes_sent"] for r in recs)


def test_two_cluster_run_with_deltas_trains_like_uncompressed_on_fewer_bytes(tmp_path):
    ref, ref_bytes = _two_clusters(tmp_path, "none", "none")
    got, got_bytes = _two_clusters(tmp_path, DELTA, "delta")
    assert sorted(got) == list(range(24))
    late = lambda losses: np.mean([losses[s] for s in range(18, 24)])  # noqa: E731
    assert late(got) < 0.8 * np.mean([got[s] for s in range(4)])  # it trains
    assert late(got) == pytest.approx(late(ref), rel=0.05)
    assert got_bytes < ref_bytes / 5, (got_bytes, ref_bytes)


@pytest.mark.parametrize("forward,match", [
    ("delta(int2_block, cache_mb=0)", "invalid value 0 for 'cache_mb'"),
    ("delta(int2_block, first=int3)", "unknown codec 'int3'"),
    ("delta", "takes exactly one inner codec")])
def test_bad_delta_settings_in_the_job_file_are_one_line(tmp_path, forward, match):
    job = toy_job(tmp_path, clusters=[{"id": "A"}, {"id": "B"}], stages=TWO_STAGES,
                  compression={"forward": forward, "backward": "int8"})
    with pytest.raises(Exception, match=match) as info:
        load_job_config(job)
    assert "\n" not in str(info.value) and "compression.forward" in str(info.value)


def test_a_delta_codec_on_the_gradients_is_refused_when_the_job_file_loads():
    """Gradients carry no example ids: `compression.backward: delta(...)` is refused at load, in one line."""
    from nebula.config.job_sections import CompressionConfig

    with pytest.raises(ValueError) as err:
        CompressionConfig(forward="delta(int2_block)", backward="delta(int2_block)")
    assert "compression.backward" in str(err.value) and "forward only" in str(err.value)
    assert "\n" not in str(err.value)
    CompressionConfig(forward="delta(int2_block)", backward="int4_block")  # the forward direction takes it
