"""Tensors between two ranks of one cluster over paddle.distributed point-to-point (gloo on CPU, NCCL/XCCL on
accelerators): the cluster-local path of an in-cluster layer pipeline.

An activation's shape is only known once its stage has run, so `send_tensor` first sends a fixed-size header
(dtype code, rank, shape) and then the data; gradients come back with the shape the receiver already knows.
Each link between consecutive ranks has its own two-rank process group (`make_groups`): on gloo, Paddle's
process group numbers every operation, point-to-point ones included, so ranks that sent different numbers of
messages in the global group (a middle stage sends twice as many as an end stage) would no longer agree on the
next collective and time out. A pair group keeps both ends' counts equal by construction.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    import paddle

__all__ = ["send_tensor", "recv_tensor", "send_like", "recv_like", "ping_pong", "make_groups", "Groups", "wait_all"]

_MAX_DIMS = 8
_DTYPES = ["float32", "float16", "bfloat16", "float64", "int64", "int32"]


@dataclass(slots=True)
class Groups:
    """The process groups of one rank: a two-rank group per link to a neighbour, and its stage's replicas."""

    pairs: dict[int, Any] = field(default_factory=dict)  # lower rank of a consecutive pair -> its group
    stage: Any = None  # the replicas of this rank's stage (None with one replica)

    def link(self, a: int, b: int) -> Any:
        """The group of the link between consecutive ranks `a` and `b`."""
        return self.pairs[min(a, b)]


def make_groups(rank: int, world: int, stage_ranks: list[list[int]] | None = None) -> Groups:
    """Create, on every rank in the same order, a group per consecutive rank pair and one per stage's replicas
    (one at a time, retried together when gloo fails to connect one: see nebula.pipeline.groups)."""
    from nebula.pipeline.groups import create_groups

    pairs = [[a, a + 1] for a in range(world - 1)]
    stages = [list(r) for r in stage_ranks or [] if len(r) >= 2]
    groups = create_groups(pairs + stages, world=world)
    out = Groups()
    for (a, b), g in zip(pairs, groups):
        if rank in (a, b):
            out.pairs[a] = g
    for ranks, g in zip(stages, groups[len(pairs):]):
        if rank in ranks:
            out.stage = g
    return out


def _header(t: "paddle.Tensor") -> np.ndarray:
    shape = list(t.shape)
    if len(shape) > _MAX_DIMS:
        raise ValueError(f"tensor of {len(shape)} dims cannot cross a stage boundary (at most {_MAX_DIMS}); "
                         "reshape it in the stage")
    dtype = str(t.dtype).replace("paddle.", "")
    if dtype not in _DTYPES:
        raise ValueError(f"dtype {dtype} cannot cross a stage boundary; cast to one of {', '.join(_DTYPES)}")
    h = np.zeros(2 + _MAX_DIMS, dtype=np.int64)
    h[0], h[1] = _DTYPES.index(dtype), len(shape)
    h[2:2 + len(shape)] = shape
    return h


def send_tensor(t: "paddle.Tensor", dst: int, group: Any, pending: list | None = None) -> None:
    """Send `t` (any shape, a supported dtype) to global rank `dst` over `group`: header, then data.

    With `pending`, the sends are started and their tasks (and tensors, which must stay alive) appended there, for
    `wait_all` later: the sender computes on while the receiver is still busy with an earlier micro-batch."""
    import paddle
    import paddle.distributed as dist

    header, data = paddle.to_tensor(_header(t)), t.detach()
    if pending is None:
        dist.send(header, dst=dst, group=group)
        dist.send(data, dst=dst, group=group)
        return
    pending.append((dist.isend(header, dst=dst, group=group), header))
    pending.append((dist.isend(data, dst=dst, group=group), data))


def wait_all(pending: list) -> None:
    """Wait for every started send in `pending`, then empty it."""
    for task, _ in pending:
        task.wait()
    pending.clear()


def recv_tensor(src: int, group: Any) -> "paddle.Tensor":
    """Receive one tensor sent by `send_tensor` from global rank `src` over `group`."""
    import paddle
    import paddle.distributed as dist

    h = paddle.zeros([2 + _MAX_DIMS], dtype="int64")
    dist.recv(h, src=src, group=group)
    hv = h.numpy()
    code, ndim = int(hv[0]), int(hv[1])
    if not 0 <= code < len(_DTYPES) or not 0 <= ndim <= _MAX_DIMS:
        raise RuntimeError(f"malformed tensor header from rank {src}: {hv.tolist()}; both ranks must run the same "
                           "nebula version and schedule")
    out = paddle.empty([int(x) for x in hv[2:2 + ndim]], dtype=_DTYPES[code])
    dist.recv(out, src=src, group=group)
    return out


def send_like(t: "paddle.Tensor", dst: int, group: Any, pending: list | None = None) -> None:
    """Send `t` whose shape and dtype the receiver already knows (a gradient going back); `pending` as in
    `send_tensor`."""
    import paddle.distributed as dist

    data = t.detach()
    if pending is None:
        dist.send(data, dst=dst, group=group)
    else:
        pending.append((dist.isend(data, dst=dst, group=group), data))


def recv_like(like: "paddle.Tensor", src: int, group: Any) -> "paddle.Tensor":
    """Receive a tensor shaped like `like` from `src` over `group`."""
    import paddle
    import paddle.distributed as dist

    out = paddle.empty(like.shape, dtype=like.dtype)
    dist.recv(out, src=src, group=group)
    return out


def ping_pong(peer: int, leader: bool, nbytes: int, repeats: int, group: Any) -> float:
    """Median round-trip seconds of an `nbytes` message to `peer` and back (one warm-up round first)."""
    import paddle
    import paddle.distributed as dist

    buf = paddle.zeros([max(1, nbytes // 4)], dtype="float32")
    times = []
    for i in range(repeats + 1):
        t0 = time.perf_counter()
        if leader:
            dist.send(buf, dst=peer, group=group)
            dist.recv(buf, src=peer, group=group)
        else:
            dist.recv(buf, src=peer, group=group)
            dist.send(buf, dst=peer, group=group)
        if i:
            times.append(time.perf_counter() - t0)
    return float(np.median(times))
