"""The per-rank loop of `mode: data_parallel` on the stage runner: the pipeline mode's schedule with every stage in
this cluster, and an outer step every `sync_every` steps that averages the clusters' replicas over the WAN.

Inside a cluster the ranks are data parallel as in every other mode (gradients all-reduced each step through
paddle.distributed). Between clusters only rank 0 (the leader) talks: it sends the cluster's pseudo-gradient
(anchor - replica) to the other leaders through `nebula.dataparallel.allmean.ClusterMean`, gets the mean of all
clusters', and broadcasts it to its ranks; every rank then takes the same outer step (`outer.py`), so replicas and
outer momentum stay identical everywhere. Data: step s's `global_batch * num_clusters` ids (the runtime's shared
permutation) are cut into one block of `global_batch` per cluster, in job order, so each cluster trains on its own
share; with `sync_every: 1`, average and plain SGD this is synchronous data parallelism over all clusters' data.
Checkpoints hold each cluster's replica, its inner optimizer and the outer state (anchor, momentum, last sync); a
restarted job resumes from the newest step every cluster holds; with `recovery_timeout_s` the clusters agree on it
through the switches (whole-job recovery, docs/recovery.md), the leaders talk on channels of the recovery round, and
a cluster's other ranks wait for their leader's mean at a meeting in the job's TCP store, which a leader that lost
a peer cluster releases. The codec's own state (error-feedback residuals,
low-rank warm starts) is not saved: it restarts from zero, so with such a codec a resumed run differs slightly.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from nebula.config.job import JobConfig, StageSpec
from nebula.config.schema import ConfigError
from nebula.dataparallel.allmean import ClusterLost, ClusterMean, ModelMismatch
from nebula.dataparallel.outer import (OuterState, average_step, outer_step, pack_state, pseudo_gradient,
                                       unpack_state)
from nebula.pipeline import checkpoint as ckpt
from nebula.pipeline.data import rank_micro_batches, step_ids
from nebula.pipeline.hooks import PipelineHooks
from nebula.pipeline.links import PeerLost
from nebula.pipeline.runner import RunResult, run_stages
from nebula.pipeline.stage import load_recipe

__all__ = ["DataParallelHooks", "run_data_parallel", "local_config"]

log = logging.getLogger(__name__)


def local_config(cfg: JobConfig, cluster: str, stage_names: list[str]) -> JobConfig:
    """`cfg` as the stage runner runs it in `cluster`: every stage there, back to back; checkpoints under
    `checkpoint.dir/<cluster>` (every cluster holds the same stage names)."""
    stages = tuple(StageSpec(name=n, cluster=cluster) for n in stage_names)
    ck = cfg.checkpoint
    if ck.dir:
        ck = dataclasses.replace(ck, dir=str(Path(ck.dir) / cluster))
    return dataclasses.replace(cfg, mode="pipeline", stages=stages, checkpoint=ck)


class DataParallelHooks(PipelineHooks):
    """The pipeline schedule in one cluster, plus this mode's data, start and outer steps."""

    def __init__(self, cfg: JobConfig) -> None:
        self.dp = cfg.data_parallel
        self.recovery_on = cfg.recovery_timeout_s > 0
        self.order = [c.id for c in cfg.clusters]
        self.mean: ClusterMean | None = None
        self.anchor: dict[str, np.ndarray] = {}
        self.buf: dict[str, np.ndarray] | None = None
        self.last_sync = 0
        self.fields: dict[str, Any] = {}  # this step's record: WAN bytes, sync time

    # ---- data: this cluster's block of every step ------------------------------------------------------
    def ids(self, step: int, rank: int, world: int) -> list[np.ndarray]:
        t, k = self.r.cfg.train, self.order.index(self.r.cluster)
        ids = step_ids(step, seed=t.seed, num_examples=self.r.recipe.num_examples,
                       global_batch=t.global_batch * len(self.order))
        mine = ids[k * t.global_batch:(k + 1) * t.global_batch]
        return rank_micro_batches(mine, rank=rank, world_size=world, micro_batches=t.micro_batches)

    # ---- start: resume from the newest checkpoint every cluster holds, else one initial model for all ---------
    def bind(self, runner: Any) -> None:
        super().bind(runner)
        cfg = runner.cfg
        if runner.rank == 0 and len(self.order) > 1:  # the leader's connection (no stage map: no boundaries)
            from nebula.channel import Endpoint

            runner.endpoint = Endpoint.connect(runner.spec.worker, job=cfg.job, rank=0,
                                               timeout_s=cfg.startup_timeout_s)

    def clusters(self) -> list[str]:
        return list(self.order)

    def checkpoint_steps(self) -> list[int]:
        """Checkpoints with the outer state (older ones cannot resume the outer optimizer)."""
        ck = self.r.cfg.checkpoint
        return ckpt.local_steps(ck.dir, self.r.cluster, self.r.stages.names, extra=True) if ck.dir else []

    def agree(self, steps: list[int]) -> int:
        return -1  # the pipeline's resume agrees along boundaries; the leaders agree in start_step instead

    def start_step(self) -> int:
        r = self.r
        cfg = r.cfg
        start = r.checkpoint_start()  # checkpoint.init_from, if given
        ck = cfg.checkpoint
        steps = r.resume_steps(extra=True)
        params = r.stages.params()
        mine = {k: p.numpy() for k, p in params.items()}
        adopted, resume = None, max(steps, default=-1)
        if r.rank == 0 and len(self.order) > 1:
            tag = r.recovery.tag if r.recovery is not None else ""
            self.mean = ClusterMean(r.endpoint, self.order, codec=self.dp.outer.codec, timeout_s=cfg.peer_timeout_s,
                                    startup_timeout_s=cfg.startup_timeout_s, channel=f"dp.{tag}" if tag else None)
            plan = {"sync_every": self.dp.sync_every, "outer": dataclasses.asdict(self.dp.outer),
                    "steps": cfg.train.steps, "global_batch": cfg.train.global_batch, "start": start}
            adopted, resume = self._guard(lambda: self.mean.agree(mine, plan, steps))
        self._meet("start")
        resume = self._broadcast_int(resume)
        if resume >= 0:  # replica, inner optimizer and outer state (anchor, momentum, last sync) of that step
            d = ckpt.step_dir(ck.dir, resume)
            start = ckpt.load(d, r.stages.states())
            try:
                self.anchor, self.buf, self.last_sync = unpack_state(ckpt.load_extra(d, r.cluster) or {}, mine)
            except ValueError as exc:
                raise ConfigError(f"checkpoint {d}: {exc}; remove it or set checkpoint.resume: false") from None
            log.info("cluster %s rank %d: resumed from checkpoint step %d (last sync at step %d)", r.cluster,
                     r.rank, start, self.last_sync)
            return start
        self.last_sync, self.buf = start, None
        self.anchor = self._broadcast(adopted, mine)
        for k, p in params.items():
            p.set_value(self.anchor[k])
        return start

    def extra_state(self) -> dict[str, np.ndarray]:
        """The outer optimizer's state, saved in every checkpoint so that a restart resumes it exactly."""
        return pack_state(OuterState(self.anchor, self.buf, self.last_sync))

    # ---- outer step -------------------------------------------------------------------------------------
    def step(self, step: int) -> float | None:
        loss = super().step(step)
        done = step + 1
        if done % self.dp.sync_every == 0 or done == self.r.cfg.train.steps:
            self._sync(done)
        else:
            self.fields = {"synced": False, "sync_s": 0.0, "bytes_sent": 0,
                           "wan_bytes": self.mean.sent_bytes if self.mean else 0}
        return loss

    def record_fields(self) -> dict[str, Any]:
        return self.fields

    def _sync(self, done: int) -> None:
        t0 = time.perf_counter()
        params = self.r.stages.params()
        delta = pseudo_gradient(self.anchor, {k: p.numpy() for k, p in params.items()})
        before = self.mean.sent_bytes if self.mean else 0
        mean = None
        if self.mean is not None:
            n = self.r.cfg.train.global_batch * (done - self.last_sync)
            mean = self._guard(lambda: self.mean.mean(delta, n))
        self._meet(f"sync/{done}")
        mean = self._broadcast(mean, delta)
        out = self.dp.outer
        if out.algorithm == "average":
            self.anchor = average_step(self.anchor, mean)
        else:
            self.anchor, self.buf = outer_step(self.anchor, mean, self.buf, lr=out.lr, momentum=out.momentum,
                                               nesterov=out.nesterov)
        for k, p in params.items():
            p.set_value(self.anchor[k])
        self.last_sync = done
        sent = self.mean.sent_bytes if self.mean else 0
        self.fields = {"synced": True, "sync_s": round(time.perf_counter() - t0, 6), "bytes_sent": sent - before,
                       "wan_bytes": sent}

    # ---- helpers ----------------------------------------------------------------------------------------
    def _meet(self, name: str) -> None:
        """With recovery, the ranks wait for their leader's WAN exchange in the job's TCP store, not in a gloo
        broadcast (which gives up after 30 s, and which a leader that lost a peer cluster would never join: it
        gives the round up instead, and the others stop with StepAbandoned)."""
        r = self.r
        if r.recovery is not None and r.recovery.fence is not None:
            wait = max(r.cfg.peer_timeout_s, r.cfg.startup_timeout_s) + 60.0
            r.recovery.fence.meet(f"dp/{name}", timeout_s=wait)

    def _guard(self, fn: Any) -> Any:
        """Run a WAN exchange; a silent cluster becomes PeerLost, a differing model a ConfigError."""
        try:
            return fn()
        except ClusterLost as exc:
            raise PeerLost(exc.cluster, str(exc)) from None
        except ModelMismatch as exc:
            raise ConfigError(f"data_parallel: {exc}") from None

    def _broadcast_int(self, value: int) -> int:
        """The leader's `value` on every rank of this cluster."""
        if self.r.world == 1:
            return value
        import paddle
        import paddle.distributed as dist

        t = paddle.to_tensor(np.array([value], dtype=np.int64))
        dist.broadcast(t, src=0)
        return int(t.numpy()[0])

    def _broadcast(self, value: dict[str, np.ndarray] | None, like: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The leader's `value` on every rank of this cluster (one flat broadcast); `like` gives the layout."""
        if self.r.world == 1:
            return value if value is not None else like
        import paddle
        import paddle.distributed as dist

        if self.r.rank == 0:
            src = value if value is not None else like
            flat = np.concatenate([np.asarray(src[k], np.float32).ravel() for k in like])
        else:
            flat = np.zeros(sum(v.size for v in like.values()), np.float32)
        t = paddle.to_tensor(flat)
        dist.broadcast(t, src=0)
        flat = t.numpy()
        out, off = {}, 0
        for k, v in like.items():
            out[k] = flat[off: off + v.size].reshape(v.shape).astype(v.dtype, copy=False)
            off += v.size
        return out


def run_data_parallel(cfg: JobConfig, cluster: str, *, wiring: Any = None, workdir: str | Path | None = None
                      ) -> RunResult:
    """Train this rank's replica of job `cfg` (mode data_parallel) in `cluster`, averaging with the other clusters.

    Raises PeerLost when another cluster stays silent past peer_timeout_s and ConfigError when the clusters'
    models or settings differ. (`wiring` is for the stage modes' in-process tests; this mode has no boundaries.)
    """
    if wiring is not None:
        raise ValueError("mode data_parallel has no stage boundaries to wire")
    names = list(load_recipe(cfg.recipe).stage_names)
    return run_stages(local_config(cfg, cluster, names), cluster, DataParallelHooks(cfg), workdir=workdir)
