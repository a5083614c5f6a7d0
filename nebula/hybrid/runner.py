"""Hybrid DP x PP inside one cluster: a layer pipeline over the cluster's ranks, replicated for data parallelism.

Each rank runs one stage (a contiguous range of the recipe's layers, cut by an allocation's partition index) of
one replica. Schedule (GPipe, fill and drain): every stage runs the forwards of all micro-batches, receiving each
activation from the previous stage and sending its output to the next; then the backwards of all micro-batches in
the same order, receiving each output gradient from the next stage and sending the input gradient back. Every
link carries its messages in one order, so blocking sends cannot deadlock. After the drain the replicas of each
stage average their gradients (all-reduce over a sub-group per stage), then every stage steps its optimizer.
With per-parameter optimizers this is exactly the unpartitioned model on the step's whole batch.

Before training the ranks may run the device benchmark (nebula.hybrid.probe) and cut the layers with an
allocator of nebula.balance; per-layer checkpoints (nebula.hybrid.checkpoint) let a later run resume on another
layout.
"""
from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from nebula.config.job import JobConfig, PipelineSpec
from nebula.hybrid import checkpoint as ckpt
from nebula.hybrid.cut import HybridPlan, plan_bounds
from nebula.hybrid.layered import build_layers, layered_model
from nebula.hybrid.p2p import recv_like, recv_tensor, send_like, send_tensor, wait_all
from nebula.hybrid.topology import Layout
from nebula.pipeline.data import rank_micro_batches, step_ids
from nebula.pipeline.metrics import MetricsWriter
from nebula.pipeline import checkpoint as pck
from nebula.pipeline.cluster_stages import join_cluster
from nebula.pipeline.runner import RunResult
from nebula.pipeline.stage import load_recipe

__all__ = ["run_hybrid"]

log = logging.getLogger(__name__)

# the layer benchmark: rounds after the warm-up, at least and at most, and the time budget of all ranks' rounds
LAYER_ROUNDS, MAX_LAYER_ROUNDS, LAYER_BUDGET_S = 3, 30, 4.0

class _HybridRunner:
    """State and GPipe schedule of one rank."""

    def __init__(self, cfg: JobConfig, cluster: str, workdir: Path) -> None:
        import paddle

        self.cfg, self.cluster = cfg, cluster
        self.spec = cfg.cluster(cluster)
        pp = self.spec.pipeline
        if pp is None:
            raise ValueError(f"cluster {cluster} has no pipeline section; set clusters[{cluster}].pipeline")
        self.pp = pp
        self.rank, self.world = join_cluster(cfg, cluster)
        self.layout = Layout(pp.num_stages, self.world // pp.num_stages)
        self.stage, self.replica = self.layout.stage_of(self.rank), self.layout.replica_of(self.rank)
        self.slowdown = pp.slowdown[self.rank] if pp.slowdown else 1.0
        from nebula.balance.simulate import Slowdown

        self._slowdown = Slowdown(compute=self.slowdown)
        self.groups = None
        if self.world > 1:
            from nebula.hybrid.p2p import make_groups

            self.groups = make_groups(self.rank, self.world,
                                      [self.layout.stage_ranks(s) for s in range(self.layout.num_stages)])
        self.group = self.groups.stage if self.groups is not None else None
        self.model = layered_model(load_recipe(cfg.recipe))
        self.plan = self._plan()
        self.start, self.stop = self.plan.bounds[self.stage], self.plan.bounds[self.stage + 1]
        self.layers = build_layers(self.model, self.start, self.stop, cfg.train.seed)
        self.net = paddle.nn.Sequential(*self.layers)
        self.opt = self.model.build_optimizer(list(self.net.parameters()))
        self.first, self.last = self.stage == 0, self.stage == self.layout.num_stages - 1
        self.prev_rank = self.rank - 1 if not self.first else None
        self.next_rank = self.rank + 1 if not self.last else None
        self._prev_group = self.groups.link(self.rank, self.prev_rank) if self.prev_rank is not None else None
        self._next_group = self.groups.link(self.rank, self.next_rank) if self.next_rank is not None else None
        self.metrics = MetricsWriter(cfg.metrics.dir, cluster, self.rank)
        if self.rank == 0 and cfg.metrics.dir:
            self._write_plan(Path(cfg.metrics.dir) / f"{cluster}.plan.json")
        self._wait_s = 0.0
        self._compute_s = 0.0
        log.info("cluster %s rank %d: stage %d of %d, replica %d of %d, layers %d..%d (%s)", cluster, self.rank,
                 self.stage, self.layout.num_stages, self.replica, self.layout.num_replicas, self.start,
                 self.stop - 1, self.plan.method)

    def _write_plan(self, path: Path) -> None:
        """The layout, the cut, the measured ranks and the predicted times, for benchmarks and people."""
        import json

        doc = {**self.plan.record(), "micro_batches": self.cfg.train.micro_batches,
               "slowdown": list(self.pp.slowdown), "probe_together": self._probe_together(),
               "probes": [p.to_dict() for p in self.plan.probes]}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc, indent=1))

    # ---- allocation ---------------------------------------------------------------------------------------
    def _plan(self) -> HybridPlan:
        """Explicit bounds as they are; else benchmark the ranks (links, memory, every layer on every rank) and cut.

        Without `probe` only rank 0 times the layers and every rank counts as identical to it."""
        pp, t = self.pp, self.cfg.train
        n = self.model.num_layers
        if pp.bounds is not None and len(pp.bounds) == self.layout.num_stages + 1:
            return plan_bounds(n, self.layout, pp)
        from nebula.hybrid.costs import LayerTimer, costs_from_timings, time_layers
        from nebula.hybrid.probe import RankProbe, gather, in_turns, probe_ranks

        batch = t.global_batch // (self.layout.num_replicas * t.micro_batches)
        if pp.probe:
            together = self._probe_together()
            probes = probe_ranks(rank=self.rank, world=self.world, groups=self.groups, device=self.spec.device,
                                 slowdown=self.slowdown, together=together)
            timer = LayerTimer(self.model, batch, seed=t.seed, slowdown=self.slowdown)
            rounds, start = 0, time.perf_counter()
            while True:  # rounds in turns (or together) until rank 0's budget is spent
                in_turns(self.rank, self.world, together, lambda: timer.round(record=rounds > 0))
                rounds += 1
                go = rounds <= LAYER_ROUNDS or (rounds <= MAX_LAYER_ROUNDS and
                                                time.perf_counter() - start < LAYER_BUDGET_S)
                if gather(go, self.world)[0] is False:
                    break
            timings = gather(timer.result(), self.world)
        else:
            probes = [RankProbe(r, 1.0, 1.0, float("inf"), 0.0, float("inf")) for r in range(self.world)]
            mine = time_layers(self.model, batch, seed=t.seed, budget_s=0.5) if self.rank == 0 else None
            timings = [gather(mine, self.world)[0]] * self.world
        costs, tpf = costs_from_timings(timings, batch, micro_batches=t.micro_batches)
        return plan_bounds(n, self.layout, pp, probes=probes, costs=costs, time_per_flop_s=tpf, timings=timings,
                           micro_batches=t.micro_batches, cores=self._pipeline_cores())

    @staticmethod
    def _host_cores() -> int:
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)

    def _probe_together(self) -> bool:
        from nebula.hybrid.probe import probe_together

        return probe_together(self.pp.probe_together, self.spec.device, self.spec.procs_per_node, self._host_cores())

    def _pipeline_cores(self) -> float:
        """CPU cores one replica's stages share: each rank's share of its host's cores, times the stages (inf on
        accelerators, whose compute does not share the host's cores)."""
        if self.spec.device != "cpu":
            return float("inf")
        return self.layout.num_stages * min(1.0, self._host_cores() / self.spec.procs_per_node)

    # ---- compute with simulated slowdown ------------------------------------------------------------------
    def _slow(self, t0: float) -> None:
        """Account the compute since `t0`, stretched by this rank's simulated slowdown (nebula.balance.simulate)."""
        self._slowdown.apply_compute(time.perf_counter() - t0)
        self._compute_s += time.perf_counter() - t0

    def _recv(self, fn: Any, *args: Any) -> Any:
        t0 = time.perf_counter()
        out = fn(*args)
        self._wait_s += time.perf_counter() - t0
        return out

    # ---- one step -----------------------------------------------------------------------------------------
    def _micro_batches(self, step: int) -> list[np.ndarray]:
        t = self.cfg.train
        ids = step_ids(step, seed=t.seed, num_examples=self.model.num_examples, global_batch=t.global_batch)
        return rank_micro_batches(ids, rank=self.replica, world_size=self.layout.num_replicas,
                                  micro_batches=t.micro_batches)

    def _step(self, step: int) -> float:
        import paddle
        import paddle.distributed as dist

        mbs = self._micro_batches(step)
        m_count = len(mbs)
        saved: list[tuple[Any, Any]] = []  # (input, output-or-loss) per micro-batch
        pending: list = []  # sends in flight: compute goes on while the next stage is busy
        loss_sum = 0.0
        for ids in mbs:  # fill: all forwards
            t0 = time.perf_counter()
            if self.first:
                x = self.model.inputs(ids)
            else:
                x = self._recv(recv_tensor, self.prev_rank, self._prev_group)
                x.stop_gradient = False
                t0 = time.perf_counter()
            y = self.net(x)
            if self.last:
                y = self.model.loss(y, self.model.targets(ids))
                loss_sum += float(y.numpy())
                # 1/R too: the replicas' all-reduce then sums to the mean over the step's whole batch
                y = y / (m_count * self.layout.num_replicas)
            self._slow(t0)
            if not self.last:
                send_tensor(y, self.next_rank, self._next_group, pending)
            saved.append((x, y))
        for x, y in saved:  # drain: all backwards, same order
            if self.last:
                t0 = time.perf_counter()
                y.backward()
            else:
                g = self._recv(recv_like, y, self.next_rank, self._next_group)
                t0 = time.perf_counter()
                y.backward(g)
            self._slow(t0)
            if not self.first:
                send_like(x.grad, self.prev_rank, self._prev_group, pending)
        wait_all(pending)
        if self.group is not None:
            for p in self.net.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad, group=self.group)
        self.opt.step()
        self.opt.clear_grad()
        if self.world == 1:
            return loss_sum / m_count
        # every rank learns the step's loss: the last stage's replicas contribute their means
        t = paddle.to_tensor(np.array([loss_sum / m_count if self.last else 0.0], dtype=np.float64))
        dist.all_reduce(t)
        return float(t.numpy()[0]) / self.layout.num_replicas

    # ---- checkpoints --------------------------------------------------------------------------------------
    def _resume(self) -> int:
        ck = self.cfg.checkpoint
        steps = ckpt.committed_steps(ck.dir, self.cluster, self.model.num_layers) if ck.dir and ck.resume else []
        if not steps:
            return 0
        step = steps[-1]
        ckpt.load_layers(ck.dir, step, self.start, self.layers, self.opt)
        old = pck.read_step_marker(ck.dir, step, self.cluster)
        log.info("cluster %s rank %d: resumed step %d (saved by %s x %s, bounds %s; now bounds %s)", self.cluster,
                 self.rank, step, old.get("num_stages"), old.get("num_replicas"), old.get("bounds"), self.plan.bounds)
        return step

    def _maybe_save(self, step_done: int, result: RunResult) -> None:
        import paddle.distributed as dist

        ck = self.cfg.checkpoint
        if not ck.dir or not (step_done == self.cfg.train.steps or (ck.every and step_done % ck.every == 0)):
            return
        if self.replica == 0:
            ckpt.save_layers(ck.dir, step_done, self.start, self.layers, self.opt)
        if self.world > 1:
            dist.barrier()
        if self.rank == 0:
            ckpt.commit(ck.dir, step_done, self.cluster, {
                **self.plan.record(), "job": self.cfg.job, "num_layers": self.model.num_layers})
            pck.prune(ck.dir, self.cluster, ckpt.layer_parts(self.model.num_layers), ck.keep)
        result.checkpoints.append(step_done)

    # ---- main loop ----------------------------------------------------------------------------------------
    def run(self) -> RunResult:
        start = self._resume()
        result = RunResult(cluster=self.cluster, rank=self.rank, start_step=start, end_step=start)
        try:
            for step in range(start, self.cfg.train.steps):
                self._wait_s = self._compute_s = 0.0
                t0 = time.perf_counter()
                loss = self._step(step)
                step_s = time.perf_counter() - t0
                result.losses[step] = loss
                self.metrics.write({
                    "step": step, "cluster": self.cluster, "rank": self.rank, "stage": self.stage,
                    "replica": self.replica, "loss": loss, "step_s": round(step_s, 6),
                    "wait_s": round(self._wait_s, 6), "compute_s": round(self._compute_s, 6),
                    "bounds": self.plan.bounds, "method": self.plan.method, "pid": os.getpid(), "time": time.time()})
                self._maybe_save(step + 1, result)
            result.end_step = self.cfg.train.steps
        finally:
            self.metrics.close()
        return result


def run_hybrid(cfg: JobConfig, cluster: str, *, workdir: str | Path | None = None) -> RunResult:
    """Train this rank's stage of the hybrid DP x PP job `cfg` on `cluster` (rank, world from the launcher's env)."""
    return _HybridRunner(cfg, cluster, Path(workdir) if workdir else Path.cwd()).run()
