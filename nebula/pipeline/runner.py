"""The per-rank training loop of every stage mode: builds this cluster's stages, wires its boundaries, resumes, runs
the steps of the mode's hooks, records metrics and saves checkpoints.

A run mode (`nebula.modes`) hands the runner its `RunHooks` (`nebula.pipeline.hooks`): the pipeline mode's
Scenario II schedule, the one-way mode's scatter (`nebula.pipeline.oneway`), or cross-cluster data parallelism's
outer steps (`nebula.dataparallel`). Ranks of a cluster are data parallel: gradients are averaged over the
cluster's process group after the micro-batches. See docs/architecture.md, "Run modes".

With `recovery_timeout_s` set, the runner takes part in whole-job recovery (docs/recovery.md): the clusters agree
through the switches where to start, every step boundary checks whether another cluster began a recovery, and a
lost peer cluster (or such a request) stops the step: the partial step is dropped, the clusters agree on the newest
checkpoint all hold, the boundaries are opened again on channels of the new round, and training goes on from there.
Recovery lives at the step boundary only (`nebula.pipeline.runner_recovery`); a step itself knows nothing of it.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nebula.config.job import JobConfig
from nebula.pipeline import checkpoint as ckpt
from nebula.pipeline.cluster_stages import ClusterStages, join_cluster
from nebula.pipeline.hooks import PipelineHooks, RunHooks, Wiring
from nebula.pipeline.links import ChannelLink, Link
from nebula.pipeline.links import PeerLost
from nebula.pipeline.metrics import MetricsWriter, boundary_fields
from nebula.pipeline.runner_recovery import PauseRequested, RankRecovery, StepAbandoned
from nebula.pipeline.stage import load_recipe
from nebula.pipeline.stale import StalePipelineHooks

__all__ = ["StageRunner", "RunResult", "Wiring", "run_stages", "run_pipeline", "replace_steps"]

log = logging.getLogger(__name__)

@dataclass(slots=True)
class RunResult:
    """What one rank did: the steps it ran and the losses it saw (global mean on the last stage's cluster)."""

    cluster: str
    rank: int
    start_step: int
    end_step: int
    losses: dict[int, float] = field(default_factory=dict)
    checkpoints: list[int] = field(default_factory=list)
    recoveries: list[int] = field(default_factory=list)  # the step resumed from after each recovery


class StageRunner:
    """State and loop of one rank; what differs between modes is in `hooks`."""

    def __init__(self, cfg: JobConfig, cluster: str, hooks: RunHooks, wiring: Wiring | None, workdir: Path) -> None:
        self.cfg, self.cluster, self.hooks = cfg, cluster, hooks
        self.spec = cfg.cluster(cluster)
        self.rank, self.world = join_cluster(cfg, cluster)
        self.segments = cfg.segments
        self.seg = [c for c, _ in self.segments].index(cluster)
        self.first_seg, self.last_seg = self.seg == 0, self.seg == len(self.segments) - 1
        self.recipe = load_recipe(cfg.recipe)
        offset = sum(len(n) for _, n in self.segments[:self.seg])
        self.stages = ClusterStages(cfg, cluster, self.recipe, self.segments[self.seg][1], offset, self.rank,
                                    self.world, workdir)
        self.scatter_wait = 0.0  # time receivers spend in the intra-cluster scatter (one-way mode)
        self.prev = self.next = None
        self.endpoint: Any = None
        self.step = 0
        self.workdir = workdir
        self.agreed: int | None = None  # with recovery: the step the clusters agreed to start or resume from
        self.recovery: RankRecovery | None = None  # (set before bind: `k: auto`'s probe opens channels there)
        hooks.bind(self)  # (the one-way mode resolves `k: auto` here, before wiring)
        clusters = hooks.clusters()
        if cfg.recovery_timeout_s > 0 and wiring is None and len(clusters) > 1:
            self.recovery = RankRecovery(self, clusters)  # the boundaries are wired once the clusters agreed
            if self.recovery.fence is not None:
                self.stages.before_reduce = self.recovery.fence.vote
        else:
            self._wire(wiring)
            hooks.wired()
        self.metrics = MetricsWriter(cfg.metrics.dir, cluster, self.rank)

    # ---- wiring -------------------------------------------------------------------------------------------
    def _wire(self, wiring: Wiring | None) -> None:
        from nebula.pipeline.boundary import Boundary

        prev_rank, next_rank = self.hooks.peer_ranks()
        if prev_rank is None and next_rank is None:
            return
        if wiring is None:
            wiring = self.hooks.channel_wiring(prev_rank, next_rank)
        codec = self.cfg.compression.spec_at
        timeout = self.cfg.peer_timeout_s
        if prev_rank is not None:
            self.prev = Boundary(side="downstream", codec=codec, peer_timeout_s=timeout, **wiring["prev"])
        if next_rank is not None:
            self.next = Boundary(side="upstream", codec=codec, peer_timeout_s=timeout, **wiring["next"])

    def channel_wiring(self, prev_rank: int | None, next_rank: int | None) -> Wiring:
        """Channels to the peer ranks of the neighbouring segments (boundary b between segments b and b+1)."""
        out: Wiring = {}
        for side, peer_rank, b in (("prev", prev_rank, self.seg - 1), ("next", next_rank, self.seg)):
            if peer_rank is not None:
                peer = self.segments[b + (0 if side == "prev" else 1)][0]
                out[side] = self.links(peer, peer_rank, f"b{b}")
        return out

    def links(self, peer: str, peer_rank: int, name: str) -> dict[str, Link]:
        """The activation, gradient and control links to `peer_rank` of cluster `peer`, on channels `name.*` (with
        recovery, `name.<round tag>.*`: new channels in every recovery round)."""
        ep = self.connect()
        if self.recovery is not None and self.recovery.tag:
            name = f"{name}.{self.recovery.tag}"
        return {kind: ChannelLink(ep, peer, peer_rank, f"{name}.{kind}") for kind in ("act", "grad", "ctl")}

    def connect(self) -> Any:
        """This rank's switch connection (opened once; the runner closes it at the end)."""
        if self.endpoint is None:
            from nebula.channel import Endpoint

            # the stage map lets the switch check the account's stage grants (refused here, before training)
            self.endpoint = Endpoint.connect(self.spec.worker, job=self.cfg.job, rank=self.rank,
                                             timeout_s=self.cfg.peer_timeout_s,
                                             stages={s.name: s.cluster for s in self.cfg.stages})
        return self.endpoint

    # ---- checkpoints --------------------------------------------------------------------------------------
    def resume_steps(self, *, extra: bool = False) -> list[int]:
        """The checkpoint steps this cluster offers to resume from: with recovery, the one the clusters agreed on
        (none for -1); else its own verified checkpoints (`extra`: those holding the mode's extra state)."""
        if self.agreed is not None:
            return [self.agreed] if self.agreed >= 0 else []
        ck = self.cfg.checkpoint
        return ckpt.local_steps(ck.dir, self.cluster, self.stages.names, extra=extra) if ck.resume and ck.dir else []

    def checkpoint_start(self) -> int:
        """Load the newest checkpoint every cluster holds (agreed by the hooks), else `checkpoint.init_from`; the
        step to start from."""
        ck = self.cfg.checkpoint
        chosen = self.hooks.agree(self.resume_steps())
        if chosen >= 0:
            start = ckpt.load(ckpt.step_dir(ck.dir, chosen), self.stages.states())
            log.info("cluster %s rank %d: resumed from checkpoint step %d", self.cluster, self.rank, start)
            return start
        if ck.init_from:
            start = ckpt.load(ck.init_from, self.stages.states())
            log.info("cluster %s rank %d: hot start from %s (step %d)", self.cluster, self.rank, ck.init_from, start)
            return start
        return 0

    def _maybe_save(self, step_done: int, result: RunResult) -> None:
        ck = self.cfg.checkpoint
        if not ck.dir or not (step_done == self.cfg.train.steps or (ck.every and step_done % ck.every == 0)):
            return
        if self.rank == 0:
            ckpt.save(ck.dir, step_done, self.cluster, self.stages.states(),
                      {"job": self.cfg.job, "seed": self.cfg.train.seed, "mode": self.cfg.mode},
                      extra=self.hooks.extra_state())
            ckpt.prune(ck.dir, self.cluster, self.stages.names, ck.keep)
        result.checkpoints.append(step_done)

    # ---- main loop ----------------------------------------------------------------------------------------
    def run(self) -> RunResult:
        cfg = self.cfg
        try:
            start = self._start()
        except BaseException:
            # flush what the start-up already sent: a peer whose handshake this rank refuses still gets this
            # rank's own (and can name the problem itself) instead of waiting out its start-up timeout for it
            with contextlib.suppress(Exception):
                self.close()
            raise
        result = RunResult(cluster=self.cluster, rank=self.rank, start_step=start, end_step=start)
        bar = None
        if cfg.metrics.progress and self.rank == 0 and start < cfg.train.steps:
            from nebula.progress import Progress

            bar = Progress(cfg.train.steps, f"{cfg.job}@{self.cluster}", start=start)
        self.step = start  # the step being run (or next, at a boundary)
        try:
            while True:
                try:
                    self._train(result, bar)
                    self.hooks.finish()
                    break
                except Exception as exc:
                    self.step = self._recover_from(exc, self.step, result)
                    if bar is not None:
                        bar.set_to(self.step)
            result.end_step = cfg.train.steps
        finally:
            if bar is not None:
                bar.close()
            with contextlib.suppress(Exception):
                self.close()
        return result

    def _train(self, result: RunResult, bar: Any) -> None:
        """Steps from `self.step` to the end; with recovery, a pause another cluster asked for stops at a
        boundary."""
        while (step := self.step) < self.cfg.train.steps:
            for b in self.boundaries():
                b.wait_s = 0.0
            self.scatter_wait = 0.0
            t0 = time.perf_counter()
            with self.stages.no_sync():
                loss = self.hooks.step(step)
            for b in self.boundaries():
                b.flush()
            self._record(step, loss, time.perf_counter() - t0, result)
            self._maybe_save(step + 1, result)
            self.step = step + 1
            if bar is not None:
                bar.update(1, **({} if loss is None else {"loss": f"{loss:.4f}"}))
            if self.recovery is not None and self.step < self.cfg.train.steps and self.recovery.pause_at(self.step):
                raise PauseRequested(f"cluster {self.cluster}: another cluster began a recovery")

    def _cause(self, exc: BaseException) -> BaseException | None:
        """What stopped the step when recovery can handle it (a lost peer, a sibling that gave the step up, a
        pause), else None; a PeerLost raised inside backward is found on its boundary (paddle wraps it)."""
        lost = next((b.lost for b in self.boundaries() if b.lost is not None), None)
        if lost is not None:
            return lost
        if isinstance(exc, (PeerLost, StepAbandoned, PauseRequested)):
            return exc
        return None

    def _recover_from(self, exc: Exception, step: int, result: RunResult) -> int:
        """Recover from `exc` if recovery can (again, when the resume itself loses a peer), else raise it."""
        while True:
            cause = self._cause(exc)
            if self.recovery is None or cause is None:
                if cause is not None and cause is not exc:
                    raise cause from None  # the cause, not paddle's wrapping of an error raised inside backward
                raise exc
            try:
                return self._recover(step, cause, result)
            except Exception as again:  # noqa: BLE001 - a peer lost while resuming: the next round
                exc = again

    def _start(self) -> int:
        """The first step: with recovery, after the clusters agreed where to start (then the boundaries are
        wired on the round's channels); the hooks' own start-up (handshakes, loading) follows."""
        if self.recovery is not None:
            self.agreed = self.recovery.start(self.hooks.checkpoint_steps())
            self._wire(None)
            self.hooks.wired()
        return self.hooks.start_step()

    def _recover(self, step: int, cause: BaseException, result: RunResult) -> int:
        """Drop the partial step, agree with the other clusters, reopen the boundaries on the new round's channels
        and load the agreed checkpoint; the step to go on from."""
        old = self.boundaries()
        self.prev = self.next = None
        for b in old:  # (a send to a lost peer may never complete: never wait for it here)
            threading.Thread(target=b.close, name="close-abandoned-boundary", daemon=True).start()
        self.hooks.abandon()
        self.agreed = self.recovery.recover(step, cause, self.hooks.checkpoint_steps)
        if self.agreed < 0:  # no common checkpoint: the initial model again
            self.stages = ClusterStages(self.cfg, self.cluster, self.recipe, tuple(self.stages.names),
                                        self.stages.items[0].index, self.rank, self.world, self.workdir)
            if self.recovery.fence is not None:
                self.stages.before_reduce = self.recovery.fence.vote
        self._wire(None)
        start = self.hooks.start_step()
        result.recoveries.append(start)
        return start

    def boundaries(self) -> list[Any]:
        """This rank's boundaries (previous, next), those it has."""
        return [b for b in (self.prev, self.next) if b is not None]

    def _record(self, step: int, loss: float | None, step_s: float, result: RunResult) -> None:
        rec = {"step": step, "cluster": self.cluster, "rank": self.rank, "loss": loss,
               **boundary_fields(self.boundaries(), step_s, self.scatter_wait),
               "examples": self.cfg.train.global_batch // self.world, **self.hooks.record_fields()}
        if loss is not None:
            result.losses[step] = loss
        self.metrics.write(rec)

    def close(self) -> None:
        """Flush and stop boundaries, close the metrics file and the switch connection."""
        for b in self.boundaries():
            b.close()
        self.metrics.close()
        if self.recovery is not None:
            self.recovery.close()
        if self.endpoint is not None:
            self.endpoint.close()


def run_stages(cfg: JobConfig, cluster: str, hooks: RunHooks, *, wiring: Wiring | None = None,
               workdir: str | Path | None = None) -> RunResult:
    """Train this rank's part of job `cfg` on `cluster` (rank and world from paddle.distributed.launch's env) with
    the mode's `hooks`. `wiring` replaces the switch channels with given links (in-process tests); by default each
    boundary opens channels through `clusters[cluster].worker`. Raises PeerLost when a peer cluster stays silent
    too long."""
    return StageRunner(cfg, cluster, hooks, wiring, Path(workdir) if workdir else Path.cwd()).run()


def run_pipeline(cfg: JobConfig, cluster: str, *, wiring: Wiring | None = None,
                 workdir: str | Path | None = None) -> RunResult:
    """The pipeline mode (Scenario II) on the stage runner, synchronous or with one-step-stale weights."""
    hooks = StalePipelineHooks() if cfg.train.stale_weights else PipelineHooks()
    return run_stages(cfg, cluster, hooks, wiring=wiring, workdir=workdir)


def replace_steps(cfg: JobConfig, steps: int) -> JobConfig:
    """`cfg` with train.steps replaced (for resume and comparison runs)."""
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, steps=steps))
