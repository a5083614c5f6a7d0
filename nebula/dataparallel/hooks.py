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
a peer cluster releases. The leader's codec state goes into its cluster's checkpoint too: each codec's whole
`export_state` per tensor sent (`allmean.pack_codec_state`) -- the error-feedback residuals of `outer.codec: ef(...)`
and the warm starts (and random generator) of `lowrank(...)`, inside `ef` or not -- so a resumed leader encodes as
the uninterrupted one would and the run computes what it does; the other ranks hold none. A checkpoint saved
before this state was kept still resumes, its residuals from zero (logged once); one saved with residuals only
resumes them with cold low-rank warm starts. `auto`'s measurements are not kept (they are timings of this
machine and link, measured again after a restart), so with `auto` a resumed run may choose differently.

With `data_parallel.streaming` (Streaming DiLoCo, `nebula.dataparallel.streaming`) the leader sends one slice of the
model at a time on the slice's own schedule (`ClusterMean.post`, not waiting for delivery), reads the other clusters'
shares `delay` steps later (`ClusterMean.collect`), takes the slice's outer step with its own momentum and broadcasts
the outer result to its ranks, which merge it into their replicas. A checkpoint first waits for the slices in flight
and takes their outer steps, so it holds the anchor, each slice's momentum and the merges still due, never a slice
half merged; a resumed run computes what the uninterrupted one does.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from nebula.config.job import JobConfig
from nebula.config.schema import ConfigError
from nebula.dataparallel.allmean import ClusterLost, ClusterMean, ModelMismatch, Posted, unpack_codec_state
from nebula.dataparallel.outer import (OuterState, average_step, outer_step, pack_state, pseudo_gradient,
                                       unpack_state)
from nebula.dataparallel.streaming import Fragments, flatten_f32, merge, unflatten_f32
from nebula.pipeline import checkpoint as ckpt
from nebula.pipeline.data import rank_micro_batches, step_ids
from nebula.pipeline.hooks import PipelineHooks
from nebula.pipeline.links import PeerLost
from nebula.pipeline.runner import RunResult, run_stages
from nebula.pipeline.stage import load_recipe

__all__ = ["DataParallelHooks", "run_data_parallel", "local_config"]

log = logging.getLogger(__name__)


def local_config(cfg: JobConfig, cluster: str, stage_names: list[str]) -> JobConfig:
    """`cfg` as the stage runner runs it in `cluster` (`JobConfig.in_one_cluster`: every stage there, back to back;
    the outer steps are these hooks'); checkpoints under `checkpoint.dir/<cluster>` (every cluster holds the same
    stage names)."""
    ck = cfg.checkpoint
    if ck.dir:
        ck = dataclasses.replace(ck, dir=str(Path(ck.dir) / cluster))
    return dataclasses.replace(cfg.in_one_cluster(cluster, stage_names), checkpoint=ck)


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
        # streaming: the flat anchor, each slice's outer momentum, the merges due (slice, after which step) on every
        # rank, and on the leader the slices sent and not yet collected, in the order sent
        self.stream = self.dp.streaming
        self.frags: Fragments | None = None
        self.flat_anchor = np.zeros(0, np.float32)
        self.fbufs: dict[int, np.ndarray] = {}
        self.pending: list[tuple[int, int]] = []
        self.posted: dict[int, Posted | np.ndarray] = {}

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
            if self.stream is not None:
                plan["streaming"] = dataclasses.asdict(self.stream)
            adopted, resume = self._guard(lambda: self.mean.agree(mine, plan, steps))
        self._meet("start")
        resume = self._broadcast_int(resume)
        if resume >= 0:  # replica, inner optimizer and outer state (anchor, momentum, last sync) of that step
            d = ckpt.step_dir(ck.dir, resume)
            start = ckpt.load(d, r.stages.states())
            try:
                flat = ckpt.load_extra(d, r.cluster) or {}
                state = unpack_state(flat, mine)
                self.anchor, self.buf, self.last_sync = state.anchor, state.buf, state.last_sync
                self._resume_stream(state, mine)
                self._resume_codecs(flat, mine, d)
            except ValueError as exc:
                raise ConfigError(f"checkpoint {d}: {exc}; remove it or set checkpoint.resume: false") from None
            log.info("cluster %s rank %d: resumed from checkpoint step %d (last sync at step %d)", r.cluster,
                     r.rank, start, self.last_sync)
            return start
        self.last_sync, self.buf = start, None
        self.anchor = self._broadcast(adopted, mine)
        for k, p in params.items():
            p.set_value(self.anchor[k])
        self._resume_stream(OuterState(self.anchor, None, start, {} if self.stream else None), mine)
        return start

    def _resume_stream(self, state: OuterState, like: dict[str, np.ndarray]) -> None:
        """The streaming state of `state` (a checkpoint's or the initial one); ValueError when the checkpoint was
        written with other streaming settings, or without."""
        self.posted = {}
        if self.stream is None:
            if state.fragment_bufs is not None:
                raise ValueError("it was written with data_parallel.streaming and this job has none")
            return
        if state.fragment_bufs is None:
            raise ValueError("it was written without data_parallel.streaming and this job streams")
        flat = flatten_f32(state.anchor if state.anchor else like)
        self.frags = Fragments(flat.size, self.stream.fragments, self.dp.sync_every, self.stream.delay)
        for f, b in state.fragment_bufs.items():
            lo, hi = self.frags.bounds(f) if 0 <= f < self.frags.fragments else (0, -1)
            if b.shape != (hi - lo,):
                raise ValueError(f"its outer momentum of fragment {f} has shape {b.shape}, not ({hi - lo},) of "
                                 f"{self.frags.fragments} fragments: it was saved with other streaming settings")
        if any(not 0 <= f < self.frags.fragments for f, _ in state.pending):
            raise ValueError(f"its merges due {list(state.pending)} name fragments beyond {self.frags.fragments}: "
                             "it was saved with other streaming settings")
        self.flat_anchor = flat
        self.fbufs = {f: np.array(b, np.float32) for f, b in state.fragment_bufs.items()}
        self.pending = [(int(f), int(s)) for f, s in state.pending]

    def _resume_codecs(self, flat: dict[str, np.ndarray], like: dict[str, np.ndarray], d: Path) -> None:
        """The leader's codecs with the state of checkpoint `d` (`flat`). Every rank checks it, so that a bad
        checkpoint stops the whole cluster with one error; only the leader keeps it."""
        if len(self.order) < 2:
            return  # one cluster sends nothing: no codec
        if self.frags is None:
            shapes = {k: tuple(np.shape(v)) for k, v in like.items()}
        else:
            shapes = {f"fragment/{f}": (hi - lo,) for f in range(self.frags.fragments)
                      for lo, hi in [self.frags.bounds(f)]}
        codecs, note = unpack_codec_state(flat, self.dp.outer.codec, shapes)
        if self.mean is not None:
            self.mean.restore_codecs(codecs)
            if note:
                log.warning("cluster %s: checkpoint %s: %s", self.r.cluster, d, note)

    def extra_state(self) -> dict[str, np.ndarray]:
        """The outer optimizer's state and the leader's codec state, saved in every checkpoint so that a restart
        resumes them exactly. Streaming: the slices in flight are collected first and their outer steps taken (their
        merges stay due at their step), so the checkpoint holds no exchange half done."""
        if self.stream is None:
            out = pack_state(OuterState(self.anchor, self.buf, self.last_sync))
        else:
            self._guard(self._drain)
            anchor = unflatten_f32(self.flat_anchor, self.anchor)
            out = pack_state(OuterState(anchor, None, self.last_sync, dict(self.fbufs), tuple(self.pending)))
        if self.mean is not None:  # the leader's codecs: error-feedback residuals (after every slice posted)
            out.update(self.mean.codec_state())
        return out

    def abandon(self) -> None:
        self.posted = {}  # a recovery resumes from a checkpoint: what was in flight is gone with its round

    # ---- outer step -------------------------------------------------------------------------------------
    def step(self, step: int) -> float | None:
        loss = super().step(step)
        done = step + 1
        if self.stream is not None:
            self._stream(done)
        elif done % self.dp.sync_every == 0 or done == self.r.cfg.train.steps:
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

    # ---- streaming: slices sent in turn, merged `delay` steps later -----------------------------------------
    def _stream(self, done: int) -> None:
        """After step `done`: send the slices due (the leader posts them, not waiting), merge the outer results
        due; after the last step every slice is sent and the replicas end as the anchor."""
        t0 = time.perf_counter()
        st, frags, steps = self.stream, self.frags, self.r.cfg.train.steps
        leader = self.r.rank == 0
        last = done >= steps
        sends = frags.sends(done, steps)
        before = self.mean.sent_bytes if self.mean else 0
        params = self.r.stages.params()
        replica = None
        if sends or any(at <= done for _, at in self.pending):
            replica = flatten_f32({k: p.numpy() for k, p in params.items()})
        if last:  # the final sync sends every slice: those in flight take their outer steps first, unmerged
            if leader:
                self._guard(self._drain)
            self.pending = []
        n = self.r.cfg.train.global_batch * self.dp.sync_every
        for f in sends:
            if leader:
                lo, hi = frags.bounds(f)
                delta = self.flat_anchor[lo:hi] - replica[lo:hi]
                self.posted[f] = (self._guard(lambda: self.mean.post({f"fragment/{f}": delta}, n))
                                  if self.mean is not None else delta)
            self.pending.append((f, done if last else done + st.delay))
            self.last_sync = done
        ck = self.r.cfg.checkpoint
        saving = bool(ck.dir) and (last or bool(ck.every) and done % ck.every == 0)
        if saving and leader:  # a checkpoint holds no exchange half done: wait for the slices in flight now
            self._guard(self._drain)
        due = [f for f, at in self.pending if at <= done]
        self.pending = [(f, at) for f, at in self.pending if at > done]
        if leader:
            for f in due:
                self._guard(lambda: self._collect(f))
        if sends or due or saving:
            # the ranks wait for their leader's WAN work of this step here (not later at the step boundary, where
            # a leader that lost a peer cluster would leave them waiting): a lost peer abandons the step for all
            self._meet(f"stream/{done}")
        if due:
            if last:
                self.flat_anchor = self._broadcast({"m": self.flat_anchor} if leader else None,
                                                   {"m": self.flat_anchor})["m"]
                replica = self.flat_anchor.copy()
            else:
                spans = [frags.bounds(f) for f in due]
                outer = (np.concatenate([self.flat_anchor[lo:hi] for lo, hi in spans]) if leader else
                         np.zeros(sum(hi - lo for lo, hi in spans), np.float32))
                outer = self._broadcast({"o": outer} if leader else None, {"o": outer})["o"]
                alpha = st.merge_alpha if st.delay else 0.0
                at = 0
                for lo, hi in spans:
                    self.flat_anchor[lo:hi] = outer[at:at + hi - lo]
                    replica[lo:hi] = merge(replica[lo:hi], outer[at:at + hi - lo], alpha)
                    at += hi - lo
            new = unflatten_f32(replica, {k: p.numpy() for k, p in params.items()})
            for k, p in params.items():
                p.set_value(new[k])
        sent = self.mean.sent_bytes if self.mean else 0
        self.fields = {"synced": bool(sends), "fragments_sent": sends, "fragments_merged": due,
                       "sync_s": round(time.perf_counter() - t0, 6), "bytes_sent": sent - before, "wan_bytes": sent}

    def _collect(self, f: int) -> None:
        """Collect the slices posted up to slice `f`'s (in the order posted: the peers' shares come in that
        order) and take their outer steps on the anchor."""
        while f in self.posted:
            g = next(iter(self.posted))
            self._outer_slice(g, self.posted.pop(g))

    def _drain(self) -> None:
        """Collect every slice in flight and take its outer step (its merge stays due)."""
        while self.posted:
            g = next(iter(self.posted))
            self._outer_slice(g, self.posted.pop(g))

    def _outer_slice(self, f: int, posted: Posted | np.ndarray) -> None:
        mean = self.mean.collect(posted)[f"fragment/{f}"] if isinstance(posted, Posted) else posted
        lo, hi = self.frags.bounds(f)
        out = self.dp.outer
        a = {"f": self.flat_anchor[lo:hi]}
        if out.algorithm == "average":
            new = average_step(a, {"f": mean})
        else:
            new, buf = outer_step(a, {"f": mean}, {"f": self.fbufs[f]} if f in self.fbufs else None, lr=out.lr,
                                  momentum=out.momentum, nesterov=out.nesterov)
            self.fbufs[f] = buf["f"]
        self.flat_anchor[lo:hi] = new["f"]

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
