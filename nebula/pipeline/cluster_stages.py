"""This rank's share of a job: the process group it belongs to, and the stages its cluster runs, built from the recipe,
run back to back on a micro-batch, stepped and saved together."""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from nebula.config.job import JobConfig
from nebula.pipeline.stage import Recipe, StageContext, StageOutput

__all__ = ["ClusterStages", "LocalStage", "dist_env", "join_cluster", "normalise", "set_device", "mean_over_ranks"]


def dist_env() -> tuple[int, int]:
    """(rank, world size) of this process in its cluster, as paddle.distributed.launch set them."""
    return int(os.environ.get("PADDLE_TRAINER_ID", "0")), int(os.environ.get("PADDLE_TRAINERS_NUM", "1"))


def set_device(device: str) -> None:
    """Put this process on `device` (cpu, or the accelerator paddle.distributed.launch gave this rank)."""
    import paddle

    if device == "cpu":
        paddle.set_device("cpu")
        return
    from paddle.distributed import ParallelEnv

    paddle.set_device(f"{device}:{ParallelEnv().device_id}")


def join_cluster(cfg: JobConfig, cluster: str) -> tuple[int, int]:
    """Set the device, check the process group's size against the job and join it; (rank, world)."""
    import paddle.distributed as dist

    spec = cfg.cluster(cluster)
    set_device(spec.device)
    rank, world = dist_env()
    if world != spec.world_size:
        raise RuntimeError(f"cluster {cluster} is configured for {spec.world_size} ranks but this process group has "
                           f"{world}; start it with nebula launch")
    if world > 1:
        dist.init_parallel_env()
    return rank, world


def normalise(out: Any, last: bool) -> StageOutput:
    """A stage's forward output as a StageOutput (a bare tensor is the loss on the last stage, else what it sends)."""
    if isinstance(out, StageOutput):
        return out
    return StageOutput(loss=out) if last else StageOutput(send=out)


def mean_over_ranks(value: float, world: int) -> float:
    """The mean of `value` over the cluster's ranks (an all-reduce; `value` itself on one rank)."""
    if world == 1:
        return value
    import paddle
    import paddle.distributed as dist

    t = paddle.to_tensor(np.array([value], dtype=np.float64))
    dist.all_reduce(t)
    return float(t.numpy()[0]) / world


@dataclass(slots=True)
class LocalStage:
    """One stage this rank runs: the recipe's stage, its model (wrapped for data parallelism), bare layer and
    optimizer."""

    name: str
    index: int
    stage: Any
    model: Any  # layer (possibly wrapped by paddle.DataParallel)
    layer: Any  # the bare layer (what checkpoints hold)
    opt: Any
    ctx: StageContext


class ClusterStages:
    """The stages of `names` (consecutive, the first at model position `offset`) as this rank runs them."""

    def __init__(self, cfg: JobConfig, cluster: str, recipe: Recipe, names: tuple[str, ...], offset: int,
                 rank: int, world: int, workdir: Path) -> None:
        import paddle

        self.world = world
        # called before the gradients' all-reduce (whole-job recovery: the cluster's ranks vote in the store that
        # every one of them got its step's data, so none enters an all-reduce a sibling that lost its peer skips)
        self.before_reduce: Callable[[], None] | None = None
        spec = cfg.cluster(cluster)
        self.items: list[LocalStage] = []
        for i, name in enumerate(names):
            idx = offset + i
            ctx = StageContext(job=cfg.job, stage=name, stage_index=idx, num_stages=len(cfg.stages), cluster=cluster,
                               device=spec.device, rank=rank, world_size=world, seed=cfg.train.seed, workdir=workdir)
            stage = recipe.stage(name)
            paddle.seed(cfg.train.seed + idx)  # identical initial weights on every rank and in every mode
            layer = stage.build_model(ctx)
            opt = stage.build_optimizer(layer, ctx)
            model = paddle.DataParallel(layer) if world > 1 else layer
            self.items.append(LocalStage(name, idx, stage, model, layer, opt, ctx))

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.items]

    def __iter__(self):  # noqa: ANN204
        return iter(self.items)

    def forward(self, ids: np.ndarray, received: Any) -> StageOutput:
        """Run the stages back to back on one micro-batch; their local losses are summed."""
        x, local_loss, metrics = received, None, {}
        for s in self.items:
            batch = s.stage.load(ids, s.ctx)
            out = normalise(s.stage.forward(s.model, batch, x), s.ctx.is_last)
            if out.loss is not None:
                local_loss = out.loss if local_loss is None else local_loss + out.loss
            metrics.update(out.metrics or {})
            x = out.send
        return StageOutput(send=x, loss=local_loss, metrics=metrics or None)

    def no_sync(self) -> contextlib.ExitStack:
        """Keep DataParallel from all-reducing inside backward: micro-batch gradients accumulate locally first and
        `optimizer_step` all-reduces them once per step (backwards of a step interleave with other micro-batches'
        forwards, which DataParallel's per-backward hooks cannot express)."""
        stack = contextlib.ExitStack()
        for s in self.items:
            if s.model is not s.layer:
                stack.enter_context(s.model.no_sync())
        return stack

    def optimizer_step(self) -> None:
        """All-reduce the gradients over the cluster's ranks, step every optimizer, clear the gradients."""
        if self.before_reduce is not None:
            self.before_reduce()
        if self.world > 1:
            from paddle.distributed.fleet.utils.hybrid_parallel_util import fused_allreduce_gradients

            for s in self.items:
                fused_allreduce_gradients(list(s.layer.parameters()), None)
        for s in self.items:
            s.opt.step()
            s.opt.clear_grad()

    def clear_grad(self) -> None:
        for s in self.items:
            s.opt.clear_grad()

    def states(self) -> dict[str, tuple[Any, Any]]:
        """stage name -> (layer, optimizer): what a checkpoint saves and loads."""
        return {s.name: (s.layer, s.opt) for s in self.items}

    def params(self) -> dict[str, Any]:
        """Every trainable tensor of these stages, by stage and parameter name."""
        return {f"{s.name}.{n}": p for s in self.items for n, p in s.layer.named_parameters()}
