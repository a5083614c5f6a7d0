"""`oneway.k: auto`: rank 0 of every sender cluster times its stages, sends the time and one result to receiver rank 0,
which times its stages on that result and picks k with `choose_k`, bounded by the receiver ranks available; every
rank of a cluster learns it by broadcast."""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from nebula.pipeline.data import step_ids
from nebula.pipeline.oneway.plan import choose_k

if TYPE_CHECKING:  # pragma: no cover
    from nebula.pipeline.runner import StageRunner

__all__ = ["probe_k"]

log = logging.getLogger(__name__)

_K_PROBE, _K_PROBE_K = (-4, 0, 0), (-5, 0, 0)  # control keys of the probe exchange


def probe_k(r: StageRunner, is_sender: bool, rcv_cluster: str, rcv_world: int,
            sender_worlds: list[tuple[str, int]]) -> int:
    """k auto: time both sides on real micro-batches, choose k on receiver rank 0, share it with every rank."""
    import paddle
    import paddle.distributed as dist

    from nebula.pipeline.boundary import Boundary

    cfg = r.cfg
    num = cfg.oneway.probe_micro_batches
    max_k = rcv_world // sum(n for _, n in sender_worlds)
    per = max(cfg.train.global_batch // (rcv_world * cfg.train.micro_batches), 1)
    ids = step_ids(0, seed=cfg.train.seed, num_examples=r.recipe.num_examples, global_batch=per)

    def boundary(peer: str, rank: int, side: str) -> Boundary:
        return Boundary(side=side, codec=lambda d, s: "none", peer_timeout_s=cfg.startup_timeout_s,
                        **r.links(peer, rank, "probe"))

    k = np.array([0], dtype=np.int64)
    if r.rank == 0 and is_sender:
        b = boundary(rcv_cluster, 0, "upstream")
        sample, sender_s = _timed(lambda: r.stages.forward(ids, None), num, r)
        b.send_control(_K_PROBE, np.array([sender_s], dtype=np.float64))
        b.send_array(_K_PROBE, sample.send.detach().numpy(), "forward")
        k = b.recv_control(_K_PROBE_K, cfg.startup_timeout_s).astype(np.int64)
        b.close()
    elif r.rank == 0:
        times, samples = [], []
        for c, _ in sender_worlds:
            b = boundary(c, 0, "downstream")
            times.append(float(b.recv_control(_K_PROBE, cfg.startup_timeout_s)[0]))
            samples.append((b, b.recv_array(_K_PROBE)))
        rcv_s = np.mean([_timed(lambda x=x: r.stages.forward(ids, paddle.to_tensor(x)), num, r)[1]
                         for _, x in samples])
        k[0] = choose_k(max(times), float(rcv_s), max_k=max_k)
        log.info("oneway k auto: sender %.4f s, receiver %.4f s per micro-batch -> k=%d (at most %d)",
                 max(times), rcv_s, k[0], max_k)
        for b, _ in samples:
            b.send_control(_K_PROBE_K, k)
            b.flush()
            b.close()
    if r.world > 1:
        t = paddle.to_tensor(k)
        dist.broadcast(t, src=0)
        k = t.numpy()
    t_ = cfg.train
    kk = int(k[0])
    active = sum(n for _, n in sender_worlds)
    while kk > 1 and t_.global_batch % (active * kk * t_.micro_batches):
        kk -= 1  # the batch must split over the fed ranks
    return kk


def _timed(fn: Callable[[], Any], num: int, r: StageRunner) -> tuple[Any, float]:
    """Run forward + backward `num` times (gradients dropped); the last output and the median seconds."""
    out, times = None, []
    with r.stages.no_sync():  # only this rank runs the probe: no data-parallel all-reduce inside backward
        for _ in range(num + 1):  # the first call warms up
            t0 = time.perf_counter()
            out = fn()
            if out.loss is not None:
                out.loss.backward()
            times.append(time.perf_counter() - t0)
    r.stages.clear_grad()
    return out, float(np.median(times[1:]))
