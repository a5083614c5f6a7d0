"""Stage boundary operations as Paddle autograd functions.

`SendActivation` runs "send forward" in its forward (the activation leaves for the next stage) and "receive
backward" in its backward (its gradient comes back from the next stage). `RecvActivation` runs "receive forward"
(the activation arrives as a leaf that requires grad) and "send backward" (the gradient that autograd computes
for it goes back to the previous stage). Codecs are chosen per direction and step by the `Boundary`.

Activations and gradients stay paddle tensors end to end: on an accelerator the sending thread encodes them with
paddle ops on their device and only the compressed payloads reach the host (`nebula.compress.device`), and the
receiving thread decodes them onto this process's device; a CPU tensor is encoded and decoded by numpy, which is
cheaper there (`nebula.compress.backend.codec_path`, the one rule). Control arrays are small numpy arrays, sent
uncompressed.
"""
from __future__ import annotations

from typing import Any, Callable

import time

import numpy as np
import paddle
from paddle.autograd import PyLayer

from nebula.pipeline.links import Key, Link, LinkStats, LinkReceiver, LinkSender, PeerLost

__all__ = ["Boundary", "SendActivation", "RecvActivation", "send_forward", "recv_forward"]


class Boundary:
    """This rank's end of one stage boundary: an activation link, a gradient link and a control link."""

    def __init__(self, *, side: str, act: Link, grad: Link, ctl: Link, codec: Callable[[str, int], str],
                 peer_timeout_s: float) -> None:
        if side not in ("upstream", "downstream"):
            raise ValueError(f"side {side!r} must be upstream (sends activations) or downstream (receives them)")
        self.side = side
        self.peer_cluster, self.peer_rank = act.peer_cluster, act.peer_rank
        self.stats = LinkStats()
        self._codec = codec  # (direction, step) -> codec spec
        out_link, in_link = (act, grad) if side == "upstream" else (grad, act)
        out_lane = "activation" if side == "upstream" else "gradient"
        self.outbox = LinkSender(out_link, out_lane, self.stats)
        self.mailbox = LinkReceiver(in_link, self.stats, peer_timeout_s=peer_timeout_s,
                               what="gradient" if side == "upstream" else "activation", like="paddle",
                               keyed=None if side == "upstream" else lambda step: codec("forward", step))
        self.ctl_out = LinkSender(ctl, "control", self.stats)
        self.ctl_in = LinkReceiver(ctl, self.stats, peer_timeout_s=peer_timeout_s, what="control message")
        self._grads_sent: set[Key] = set()
        self.received: list[tuple[Key, tuple[list[int], Any]]] = []  # float activations whose gradients are owed
        self.wait_s = 0.0  # time the compute thread spent blocked on this boundary
        self.lost: PeerLost | None = None

    def send_array(self, key: Key, x: Any, direction: str, ids: np.ndarray | None = None) -> None:
        """Queue `x` (a paddle.Tensor, encoded where `codec_path` says; or a numpy array) for the peer with the codec
        for `direction` at step key[0]; `ids` (activations): each row's sample id, for activation deltas."""
        self.outbox.send(key, x, self._codec(direction, key[0]), ids)

    @property
    def cache_bytes(self) -> int:
        """Bytes this end's activation-delta caches hold (sender side upstream, receiver side downstream)."""
        return self.outbox.cache_bytes() + self.mailbox.cache_bytes()

    def recv_array(self, key: Key) -> Any:
        """Wait for the tensor under `key` on the incoming data link (counts as link wait); a paddle.Tensor."""
        return self._timed_get(self.mailbox, key)

    def _timed_get(self, box: LinkReceiver, key: Key, timeout_s: float | None = None) -> np.ndarray:
        t0 = time.perf_counter()
        try:
            return box.get(key, timeout_s)
        except PeerLost as exc:  # autograd wraps errors raised in backward: keep the original for the runtime
            self.lost = exc
            raise
        finally:
            self.wait_s += time.perf_counter() - t0

    def send_gradient(self, key: Key, g: paddle.Tensor) -> None:
        """Send the gradient of the activation received under `key` (downstream side)."""
        self._grads_sent.add(key)
        self.send_array(key, g.detach(), "backward")

    def finish_gradients(self) -> None:
        """Send zeros for received activations that did not reach the loss, so the upstream rank never hangs."""
        for key, (shape, dtype) in self.received:
            if key not in self._grads_sent:
                self.send_array(key, paddle.zeros(shape, dtype=dtype), "backward")
        self._grads_sent.clear()
        self.received.clear()

    def send_control(self, key: Key, x: np.ndarray) -> None:
        """Send a small control array (sync tensor, checkpoint agreement), uncompressed."""
        self.ctl_out.send(key, np.ascontiguousarray(x), "none")

    def recv_control(self, key: Key, timeout_s: float | None = None) -> np.ndarray:
        """Receive a control array sent under `key` (waiting up to `timeout_s`, default peer_timeout_s)."""
        return self._timed_get(self.ctl_in, key, timeout_s)

    def flush(self) -> None:
        """Wait until everything queued has left (counts as link wait)."""
        t0 = time.perf_counter()
        self.outbox.flush()
        self.ctl_out.flush()
        self.wait_s += time.perf_counter() - t0

    def close(self) -> None:
        """Flush and stop the background threads."""
        self.outbox.close()
        self.ctl_out.close()
        self.mailbox.close()
        self.ctl_in.close()


class SendActivation(PyLayer):
    """Forward: send the activation to the next stage, return a scalar token. Backward: receive its gradient."""

    @staticmethod
    def forward(ctx: Any, x: paddle.Tensor, boundary: Boundary, key: Key, ids: np.ndarray | None = None
                ) -> paddle.Tensor:
        """Send forward: queue x for the next stage; the returned token carries x's place in the graph."""
        ctx.boundary, ctx.key = boundary, key
        ctx.shape, ctx.dtype = list(x.shape), x.dtype
        boundary.send_array(key, x.detach(), "forward", ids)
        return paddle.zeros([1], dtype="float32")

    @staticmethod
    def backward(ctx: Any, dtoken: paddle.Tensor) -> paddle.Tensor:
        """Receive backward: x's gradient, computed by the next stage."""
        g = ctx.boundary.recv_array(ctx.key)
        if list(g.shape) != ctx.shape:
            raise RuntimeError(f"gradient for step {ctx.key[0]} micro-batch {ctx.key[1]} from cluster "
                               f"{ctx.boundary.peer_cluster} has shape {list(g.shape)}, expected {ctx.shape}")
        return _as_tensor(g).astype(ctx.dtype)


class RecvActivation(PyLayer):
    """Forward: pass the received activation on. Backward: send its gradient to the previous stage."""

    @staticmethod
    def forward(ctx: Any, x: paddle.Tensor, boundary: Boundary, key: Key) -> paddle.Tensor:
        """Receive forward: the activation (already received as `x`) enters this stage's graph."""
        ctx.boundary, ctx.key = boundary, key
        return paddle.assign(x)

    @staticmethod
    def backward(ctx: Any, dy: paddle.Tensor) -> paddle.Tensor:
        """Send backward: the activation's gradient goes to the previous stage."""
        ctx.boundary.send_gradient(ctx.key, dy)
        return dy


def send_forward(x: paddle.Tensor, boundary: Boundary, key: Key, ids: np.ndarray | None = None
                 ) -> paddle.Tensor | None:
    """Send `x` downstream (`ids`: the micro-batch's example ids, one per row, which activation deltas key their
    caches by); returns a token whose backward fetches x's gradient (None if x needs no gradient)."""
    if x.stop_gradient or not paddle.is_floating_point(x):
        boundary.send_array(key, x.detach(), "forward", ids)
        return None
    return SendActivation.apply(x, boundary, key, ids)


def recv_forward(boundary: Boundary, key: Key, *, with_grad: bool = True) -> paddle.Tensor:
    """Receive the activation under `key`; when it is floating point its gradient goes back on backward."""
    x = _as_tensor(boundary.recv_array(key))
    if not with_grad or not paddle.is_floating_point(x):
        return x
    x.stop_gradient = False
    boundary.received.append((key, (list(x.shape), x.dtype)))
    return RecvActivation.apply(x, boundary, key)


def _as_tensor(x: Any) -> paddle.Tensor:
    """A received tensor as a paddle.Tensor (a numpy array from a numpy-path receiver is copied in once)."""
    return x if isinstance(x, paddle.Tensor) else paddle.to_tensor(x)
