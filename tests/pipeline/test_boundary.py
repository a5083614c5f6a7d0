"""Stage boundary PyLayers over an in-process link pair: gradients equal those of the unsplit model."""
from __future__ import annotations

import numpy as np
import paddle
import pytest

from nebula.pipeline import PeerLost, queue_pair
from nebula.pipeline.boundary import Boundary, recv_forward, send_forward


def _boundaries(forward: str = "none", backward: str = "none", timeout: float = 30.0):
    a_act, b_act = queue_pair("A", "B")
    a_grad, b_grad = queue_pair("A", "B")
    a_ctl, b_ctl = queue_pair("A", "B")
    codecs = {"forward": forward, "backward": backward}
    codec = lambda direction, step: codecs[direction]  # noqa: E731
    up = Boundary(side="upstream", act=a_act, grad=a_grad, ctl=a_ctl, codec=codec, peer_timeout_s=timeout)
    down = Boundary(side="downstream", act=b_act, grad=b_grad, ctl=b_ctl, codec=codec, peer_timeout_s=timeout)
    return up, down


def _models():
    paddle.seed(11)
    return paddle.nn.Linear(6, 5), paddle.nn.Linear(5, 3)


def test_split_gradients_equal_unsplit_gradients():
    x = paddle.to_tensor(np.random.default_rng(0).standard_normal((4, 6)).astype("float32"))
    f, g = _models()
    loss_ref = (paddle.tanh(g(paddle.tanh(f(x)))) ** 2).mean()
    loss_ref.backward()
    ref = [p.grad.numpy().copy() for p in (*f.parameters(), *g.parameters())]
    f2, g2 = _models()
    up, down = _boundaries()
    try:
        token = send_forward(paddle.tanh(f2(x)), up, (0, 0, 0))
        h = recv_forward(down, (0, 0, 0))
        assert not h.stop_gradient
        loss = (paddle.tanh(g2(h)) ** 2).mean()
        loss.backward()  # sends the gradient of h upstream
        token.backward()  # receives it and continues into f2
        got = [p.grad.numpy() for p in (*f2.parameters(), *g2.parameters())]
        assert float(loss) == pytest.approx(float(loss_ref), rel=1e-6)
        for a, b in zip(ref, got):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
        up.flush()
        down.flush()
        assert up.stats.bytes_sent > 4 * 5 * 4 and down.stats.bytes_sent > 4 * 5 * 4
    finally:
        up.close()
        down.close()


def test_codecs_per_direction_compress_and_stay_close():
    x = paddle.to_tensor(np.random.default_rng(1).standard_normal((64, 6)).astype("float32"))
    f, g = _models()
    up, down = _boundaries(forward="fp16", backward="int8")
    try:
        out = paddle.tanh(f(x))
        token = send_forward(out, up, (3, 1, 0))
        h = recv_forward(down, (3, 1, 0))
        np.testing.assert_allclose(h.numpy(), out.numpy(), atol=2e-3)
        (g(h) ** 2).mean().backward()
        token.backward()
        up.flush()
        down.flush()
        assert 64 * 5 * 2 <= up.stats.bytes_sent < 64 * 5 * 4  # fp16 activations
        assert 64 * 5 <= down.stats.bytes_sent < 64 * 5 * 2  # int8 gradients
        assert f.weight.grad is not None and float(f.weight.grad.abs().sum()) > 0
    finally:
        up.close()
        down.close()


def test_unused_activation_gets_zero_gradient_instead_of_a_hang():
    f, _ = _models()
    up, down = _boundaries()
    try:
        x = paddle.ones([2, 6])
        token = send_forward(f(x), up, (0, 0, 0))
        recv_forward(down, (0, 0, 0))  # downstream ignores it
        down.finish_gradients()
        token.backward()
        assert float(f.weight.grad.abs().sum()) == 0.0
    finally:
        up.close()
        down.close()


def test_integer_tensors_travel_without_gradients():
    up, down = _boundaries()
    try:
        ids = paddle.to_tensor(np.array([3, 1, 2], dtype="int64"))
        assert send_forward(ids, up, (0, 0, 0)) is None
        got = recv_forward(down, (0, 0, 0))
        assert got.stop_gradient and got.numpy().tolist() == [3, 1, 2]
    finally:
        up.close()
        down.close()


def test_silent_peer_is_reported_by_name():
    up, down = _boundaries(timeout=1.0)
    try:
        with pytest.raises(PeerLost, match="peer cluster A .*sent nothing.*activation step 5 micro-batch 0") as ei:
            recv_forward(down, (5, 0, 0))
        assert ei.value.cluster == "A"
        with pytest.raises(PeerLost, match="gave up after 0.5 s"):  # a per-call limit (the start barrier's)
            down.recv_control((-1, 0, 0), timeout_s=0.5)
    finally:
        up.close()
        down.close()
