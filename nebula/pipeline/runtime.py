"""The per-rank training loop: builds this cluster's stages, wires its boundaries and runs the schedule.

Pipeline mode (Scenario II, Figure 7): for every micro-batch an upstream rank runs forward and sends the
activation in the background, so the next micro-batch computes while the previous one is on the link; after
the last forward it runs the backwards, each waiting for its gradient. A downstream rank runs forward and backward
per micro-batch as soon as the activation arrives and sends the gradient back at once. Ranks of a cluster are
data parallel: gradients are averaged over the cluster's process group after the micro-batches.

One-way mode (Scenario I, Figure 6): sender rank r computes k results per micro-batch and sends them to root
receiver rank r*k, which scatters them to its k receivers (itself included); after every optimizer step the
receivers all-reduce, then the root sends a small sync tensor back; a sender may run at most `oneway.sync_lag`
steps ahead of the last sync it received. Several sender clusters (M3), unequal cluster sizes, k auto and the
local hand-off live in nebula.pipeline.oneway_multi.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from nebula.config.job import JobConfig
from nebula.pipeline import checkpoint as ckpt
from nebula.pipeline.data import rank_micro_batches, step_ids
from nebula.pipeline.links import ChannelLink, Link
from nebula.pipeline.metrics import MetricsWriter
from nebula.pipeline.oneway_multi import OneWay
from nebula.pipeline.stage import StageContext, StageOutput, load_recipe

__all__ = ["run", "RunResult", "Wiring"]

log = logging.getLogger(__name__)

# links of one boundary side: {"act": Link, "grad": Link, "ctl": Link}
Wiring = dict[str, dict[str, Link]]  # "prev" / "next" -> links


@dataclass(slots=True)
class RunResult:
    """What one rank did: the steps it ran and the losses it saw (global mean on the last stage's cluster)."""

    cluster: str
    rank: int
    start_step: int
    end_step: int
    losses: dict[int, float] = field(default_factory=dict)
    checkpoints: list[int] = field(default_factory=list)


@dataclass(slots=True)
class _Local:
    name: str
    index: int
    stage: Any
    model: Any  # layer (possibly wrapped by paddle.DataParallel)
    layer: Any  # the bare layer (what checkpoints hold)
    opt: Any
    ctx: StageContext


def _dist_env() -> tuple[int, int]:
    rank = int(os.environ.get("PADDLE_TRAINER_ID", "0"))
    world = int(os.environ.get("PADDLE_TRAINERS_NUM", "1"))
    return rank, world


def _set_device(device: str) -> None:
    import paddle

    if device == "cpu":
        paddle.set_device("cpu")
        return
    from paddle.distributed import ParallelEnv

    paddle.set_device(f"{device}:{ParallelEnv().device_id}")  # the accelerator paddle.distributed.launch gave this rank


def _normalise(out: Any, last: bool) -> StageOutput:
    if isinstance(out, StageOutput):
        return out
    return StageOutput(loss=out) if last else StageOutput(send=out)


class _Runner:
    """State and schedule of one rank."""

    def __init__(self, cfg: JobConfig, cluster: str, wiring: Wiring | None, workdir: Path) -> None:
        import paddle
        import paddle.distributed as dist

        self.cfg, self.cluster = cfg, cluster
        self.spec = cfg.cluster(cluster)
        _set_device(self.spec.device)
        self.rank, self.world = _dist_env()
        if self.world != self.spec.world_size:
            raise RuntimeError(f"cluster {cluster} is configured for {self.spec.world_size} ranks but this process "
                               f"group has {self.world}; start it with nebula launch")
        if self.world > 1:
            dist.init_parallel_env()
        self.segments = cfg.segments
        self.seg = [c for c, _ in self.segments].index(cluster)
        self.first_seg, self.last_seg = self.seg == 0, self.seg == len(self.segments) - 1
        self.oneway = cfg.mode == "oneway"
        self.recipe = load_recipe(cfg.recipe)
        offset = sum(len(n) for _, n in self.segments[:self.seg])
        num_stages = len(cfg.stages)
        self.locals: list[_Local] = []
        for i, name in enumerate(self.segments[self.seg][1]):
            idx = offset + i
            ctx = StageContext(job=cfg.job, stage=name, stage_index=idx, num_stages=num_stages, cluster=cluster,
                               device=self.spec.device, rank=self.rank, world_size=self.world, seed=cfg.train.seed,
                               workdir=workdir)
            stage = self.recipe.stage(name)
            paddle.seed(cfg.train.seed + idx)  # identical initial weights on every rank and in every mode
            layer = stage.build_model(ctx)
            opt = stage.build_optimizer(layer, ctx)
            model = paddle.DataParallel(layer) if self.world > 1 else layer
            self.locals.append(_Local(name, idx, stage, model, layer, opt, ctx))
        self._scatter_wait = 0.0  # time receivers spend in the intra-cluster scatter
        self.prev = self.next = None
        self._endpoint = None
        self.ow = OneWay(self) if self.oneway else None  # Scenario I schedule (resolves k auto before wiring)
        self._wire(wiring)
        if self.ow is not None:
            self.ow.setup_groups()
        self.metrics = MetricsWriter(cfg.metrics.dir, cluster, self.rank)

    # ---- wiring -------------------------------------------------------------------------------------------
    def _peer_ranks(self) -> tuple[int | None, int | None]:
        """Rank of the peer on the previous / next boundary (None: no such boundary for this rank)."""
        if not self.oneway:
            return (self.rank if not self.first_seg else None), (self.rank if not self.last_seg else None)
        return self.ow.peer_ranks()

    def _wire(self, wiring: Wiring | None) -> None:
        from nebula.pipeline.boundary import Boundary

        prev_rank, next_rank = self._peer_ranks()
        if prev_rank is None and next_rank is None:
            return
        if wiring is None:
            wiring = (self.ow.channel_wiring(prev_rank, next_rank) if self.oneway
                      else self._channel_wiring(prev_rank, next_rank))
        codec = self.cfg.compression.spec_at
        timeout = self.cfg.peer_timeout_s
        if prev_rank is not None:
            self.prev = Boundary(side="downstream", codec=codec, peer_timeout_s=timeout, **wiring["prev"])
        if next_rank is not None:
            self.next = Boundary(side="upstream", codec=codec, peer_timeout_s=timeout, **wiring["next"])

    def _channel_wiring(self, prev_rank: int | None, next_rank: int | None) -> Wiring:
        self._connect()
        out: Wiring = {}
        for side, peer_rank, b in (("prev", prev_rank, self.seg - 1), ("next", next_rank, self.seg)):
            if peer_rank is None:
                continue
            peer = self.segments[b + (0 if side == "prev" else 1)][0]
            out[side] = {kind: ChannelLink(self._endpoint, peer, peer_rank, f"b{b}.{kind}")
                         for kind in ("act", "grad", "ctl")}
        return out

    def _connect(self) -> Any:
        """This rank's switch connection (opened once)."""
        if self._endpoint is None:
            from nebula.channel import Endpoint

            # the stage map lets the switch check the account's stage grants (refused here, before training)
            self._endpoint = Endpoint.connect(self.spec.worker, job=self.cfg.job, rank=self.rank,
                                              timeout_s=self.cfg.peer_timeout_s,
                                              stages={s.name: s.cluster for s in self.cfg.stages})
        return self._endpoint

    # ---- checkpoints --------------------------------------------------------------------------------------
    def _stage_states(self) -> dict[str, tuple[Any, Any]]:
        return {loc.name: (loc.layer, loc.opt) for loc in self.locals}

    def _agree(self, steps: list[int]) -> int:
        """The newest checkpoint step every cluster has (-1: none), agreed along the boundaries.

        Also the start barrier: no rank trains before its peers are up (waiting up to startup_timeout_s)."""
        if self.oneway:
            return self.ow.agree(steps)
        import paddle
        import paddle.distributed as dist

        pad = 64
        def enc(v: list[int]) -> np.ndarray:
            a = np.full(pad, -1, dtype=np.int64)
            v = v[-pad:]
            a[:len(v)] = v
            return a

        common = set(steps)
        if self.prev is not None:
            common &= {int(s) for s in self.prev.recv_control((-1, 0, 0), self.cfg.startup_timeout_s) if s >= 0}
        if self.next is not None:
            self.next.send_control((-1, 0, 0), enc(sorted(common)))
            chosen = int(self.next.recv_control((-2, 0, 0), self.cfg.startup_timeout_s)[0])
        elif self.prev is not None or not self.oneway or self.first_seg:
            chosen = max(common) if common else -1
        else:
            chosen = np.iinfo(np.int64).max  # non-root receiver: learns the choice from its root below
        if self.prev is not None:
            self.prev.send_control((-2, 0, 0), np.array([chosen], dtype=np.int64))
        if self.oneway and not self.first_seg and self.world > 1:
            t = paddle.to_tensor(np.array([chosen], dtype=np.int64))
            dist.all_reduce(t, op=dist.ReduceOp.MIN)
            chosen = int(t.numpy()[0])
        return chosen

    def _start_step(self) -> int:
        ck = self.cfg.checkpoint
        names = [loc.name for loc in self.locals]
        start = 0
        chosen = self._agree(ckpt.local_steps(ck.dir, self.cluster, names) if ck.resume and ck.dir else [])
        if chosen >= 0:
            start = ckpt.load(ckpt.step_dir(ck.dir, chosen), self._stage_states())
            log.info("cluster %s rank %d: resumed from checkpoint step %d", self.cluster, self.rank, start)
            return start
        if ck.init_from:
            start = ckpt.load(ck.init_from, self._stage_states())
            log.info("cluster %s rank %d: hot start from %s (step %d)", self.cluster, self.rank, ck.init_from, start)
        return start

    def _extra_state(self) -> dict[str, np.ndarray] | None:
        """State beyond the stages' that a checkpoint must hold to resume exactly (a mode's own; none here)."""
        return None

    def _maybe_save(self, step_done: int, result: RunResult) -> None:
        ck = self.cfg.checkpoint
        if not ck.dir:
            return
        due = step_done == self.cfg.train.steps or (ck.every and step_done % ck.every == 0)
        if not due:
            return
        if self.rank == 0:
            ckpt.save(ck.dir, step_done, self.cluster, self._stage_states(),
                      {"job": self.cfg.job, "seed": self.cfg.train.seed, "mode": self.cfg.mode},
                      extra=self._extra_state())
            ckpt.prune(ck.dir, self.cluster, [loc.name for loc in self.locals], ck.keep)
        result.checkpoints.append(step_done)

    # ---- schedule -----------------------------------------------------------------------------------------
    def _ids(self, step: int, rank: int, world: int) -> list[np.ndarray]:
        t = self.cfg.train
        ids = step_ids(step, seed=t.seed, num_examples=self.recipe.num_examples, global_batch=t.global_batch)
        return rank_micro_batches(ids, rank=rank, world_size=world, micro_batches=t.micro_batches)

    def _forward_local(self, ids: np.ndarray, received: Any) -> StageOutput:
        """Run this cluster's stages back to back on one micro-batch; local losses are summed."""
        x, local_loss, metrics = received, None, {}
        out = StageOutput()
        for loc in self.locals:
            batch = loc.stage.load(ids, loc.ctx)
            out = _normalise(loc.stage.forward(loc.model, batch, x), loc.ctx.is_last)
            if out.loss is not None:
                local_loss = out.loss if local_loss is None else local_loss + out.loss
            metrics.update(out.metrics or {})
            x = out.send
        return StageOutput(send=x, loss=local_loss, metrics=metrics or None)

    def _step_pipeline(self, step: int) -> float | None:
        from nebula.pipeline.boundary import recv_forward, send_forward

        mbs = self._ids(step, self.rank, self.world)
        m_count = len(mbs)
        pending = []
        loss_sum = 0.0
        for m, ids in enumerate(mbs):
            received = recv_forward(self.prev, (step, m, 0)) if self.prev is not None else None
            out = self._forward_local(ids, received)
            token = None
            if self.next is not None:
                if out.send is None:
                    raise RuntimeError(f"stage {self.locals[-1].name} returned nothing to send to the next stage")
                token = send_forward(out.send, self.next, (step, m, 0))
            total = None
            if out.loss is not None:
                loss_sum += float(out.loss.numpy())
                total = out.loss / m_count
            if token is not None:
                total = token if total is None else total + token
            if self.next is None:
                if total is not None:
                    total.backward()  # downstream end: backward at once, the gradient leaves immediately
            else:
                pending.append(total)
        for total in pending:  # upstream end: backwards in order, each waits for its gradient
            if total is not None:
                total.backward()
        if self.prev is not None:
            self.prev.finish_gradients()
        self._optimizer_step()
        if self.last_seg:
            return self._mean_over_ranks(loss_sum / m_count)
        return None

    def _no_sync(self) -> contextlib.ExitStack:
        """Keep DataParallel from all-reducing inside backward: micro-batch gradients accumulate locally first and
        `_optimizer_step` all-reduces them once per step (backwards of a step interleave with other micro-batches'
        forwards, which DataParallel's per-backward hooks cannot express)."""
        stack = contextlib.ExitStack()
        for loc in self.locals:
            if loc.model is not loc.layer:
                stack.enter_context(loc.model.no_sync())
        return stack

    def _optimizer_step(self) -> None:
        if self.world > 1:
            from paddle.distributed.fleet.utils.hybrid_parallel_util import fused_allreduce_gradients

            for loc in self.locals:
                fused_allreduce_gradients(list(loc.layer.parameters()), None)
        for loc in self.locals:
            loc.opt.step()
            loc.opt.clear_grad()

    def _mean_over_ranks(self, value: float) -> float:
        if self.world == 1:
            return value
        import paddle
        import paddle.distributed as dist

        t = paddle.to_tensor(np.array([value], dtype=np.float64))
        dist.all_reduce(t)
        return float(t.numpy()[0]) / self.world

    # ---- main loop ----------------------------------------------------------------------------------------
    def run(self) -> RunResult:
        cfg = self.cfg
        try:
            start = self._start_step()
        except BaseException:
            # flush what the start-up already sent: a peer whose handshake this rank refuses still gets this
            # rank's own (and can name the problem itself) instead of waiting out its start-up timeout for it
            with contextlib.suppress(Exception):
                self.close()
            raise
        result = RunResult(cluster=self.cluster, rank=self.rank, start_step=start, end_step=start)
        bar = None
        if cfg.metrics.progress and self.rank == 0 and start < cfg.train.steps:
            from tqdm import tqdm

            bar = tqdm(total=cfg.train.steps, initial=start, desc=f"{cfg.job}@{self.cluster}", unit="step")
        synced = {"upto": start - 1}

        def lag_ok(step: int) -> None:
            need = step - 1 - cfg.oneway.sync_lag
            while synced["upto"] < need:
                s = synced["upto"] + 1
                self.next.recv_control((s, 0, 0))
                synced["upto"] = s

        try:
            for step in range(start, cfg.train.steps):
                for b in (self.prev, self.next):
                    if b is not None:
                        b.wait_s = 0.0
                self._scatter_wait = 0.0
                t0 = time.perf_counter()
                with self._no_sync():
                    if self.oneway:
                        loss = self.ow.step(step, lag_ok)
                    else:
                        loss = self._step_pipeline(step)
                for b in (self.prev, self.next):
                    if b is not None:
                        b.flush()
                step_s = time.perf_counter() - t0
                self._record(step, loss, step_s, result)
                self._maybe_save(step + 1, result)
                if bar is not None:
                    bar.update(1)
                    if loss is not None:
                        bar.set_postfix(loss=f"{loss:.4f}")
            if self.oneway and self.ow.is_sender:
                lag_ok(cfg.train.steps + cfg.oneway.sync_lag)  # wait for the receivers' last sync: same end step
            result.end_step = cfg.train.steps
        except Exception as exc:
            lost = next((b.lost for b in (self.prev, self.next) if b is not None and b.lost is not None), None)
            if lost is not None and lost is not exc:
                raise lost from None  # the cause, not paddle's wrapping of an error raised inside backward
            raise
        finally:
            if bar is not None:
                bar.close()
            with contextlib.suppress(Exception):
                self.close()
        return result

    def _record(self, step: int, loss: float | None, step_s: float, result: RunResult) -> None:
        wait = sum(b.wait_s for b in (self.prev, self.next) if b is not None) + self._scatter_wait
        stats = [b.stats.take() for b in (self.prev, self.next) if b is not None]
        rec = {
            "step": step, "cluster": self.cluster, "rank": self.rank, "loss": loss,
            "step_s": round(step_s, 6), "wait_s": round(wait, 6), "compute_s": round(max(step_s - wait, 0.0), 6),
            "bytes_sent": sum(s.bytes_sent for s in stats), "bytes_recv": sum(s.bytes_recv for s in stats),
            "raw_bytes_sent": sum(s.raw_bytes_sent for s in stats),
            "codec_s": round(sum(s.codec_s for s in stats), 6),
            "link_bytes_per_s": self._link_rate(),
            "examples": self.cfg.train.global_batch // self.world, "time": time.time(),
            **(self.ow.extra if self.ow is not None else {}),
        }
        if loss is not None:
            result.losses[step] = loss
        self.metrics.write(rec)

    def _link_rate(self) -> float | None:
        """The lowest throughput measured on this rank's boundary links (None: none measured yet)."""
        rates = [b.outbox.link.throughput_bytes_per_s() for b in (self.prev, self.next) if b is not None]
        rates = [r for r in rates if r]
        return round(min(rates), 1) if rates else None

    def close(self) -> None:
        """Flush and stop boundaries, close the metrics file and the switch connection."""
        for b in (self.prev, self.next):
            if b is not None:
                b.close()
        self.metrics.close()
        if self._endpoint is not None:
            self._endpoint.close()


def run(cfg: JobConfig, cluster: str, *, wiring: Wiring | None = None, workdir: str | Path | None = None) -> RunResult:
    """Train this rank's part of job `cfg` on `cluster` (rank and world from paddle.distributed.launch's env).

    `wiring` replaces the switch channels with given links (in-process tests); by default each boundary opens
    channels through `clusters[cluster].worker`. Raises PeerLost when a peer cluster stays silent too long.
    """
    runner = _Runner(cfg, cluster, wiring, Path(workdir) if workdir else Path.cwd())
    return runner.run()


def replace_steps(cfg: JobConfig, steps: int) -> JobConfig:
    """`cfg` with train.steps replaced (for resume and comparison runs)."""
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, steps=steps))
