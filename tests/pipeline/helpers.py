"""Shared helpers of the pipeline tests: two clusters in one process, the stale-weights reference; `toy_job` is the
test bed's (`testbed.clusters`)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from testbed.clusters import toy_job

__all__ = ["TWO_STAGES", "run_two_clusters", "stale_reference", "toy_job"]

TWO_STAGES = [{"name": "embed", "cluster": "A"}, {"name": "head", "cluster": "B"}]


def run_two_clusters(cfg: Any, wiring_a: dict, wiring_b: dict, workdir: Path, *,
                     a_ready: Any = None, timeout_s: float = 300) -> tuple[Any, Any]:
    """Cluster A in a thread and cluster B here, one process, joined by in-process links; their RunResults (A's
    error re-raised). `a_ready()`, polled before B starts, holds B back until A is ready (paddle's seed is
    process-wide: stages built at once in two threads would draw other initial weights than two processes)."""
    import threading
    import time

    from nebula.modes import run

    out: dict[str, Any] = {}

    def side_a() -> None:
        try:
            out["A"] = run(cfg, "A", wiring=wiring_a, workdir=workdir)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            out["A"] = exc

    t = threading.Thread(target=side_a, name="cluster-A")
    t.start()
    deadline = time.monotonic() + 60
    while a_ready is not None and not a_ready() and t.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        res_b = run(cfg, "B", wiring=wiring_b, workdir=workdir)
    finally:
        t.join(timeout=timeout_s)
    if isinstance(out.get("A"), BaseException):
        raise out["A"]
    return out.get("A"), res_b


def stale_reference(cfg: Any, tmp_path: Path) -> dict[int, float]:
    """The losses of toy job `cfg` (stages embed on A, head on B) with `train.stale_weights: N`, by the update rule
    in one process: A's gradient of step k is computed at step k's weights and applied after step k+N's forwards
    (at a drain, every pending one is applied); B steps at once. With N = 0: the synchronous run."""
    import paddle

    from nebula.pipeline.cluster_stages import ClusterStages
    from nebula.pipeline.data import rank_micro_batches, step_ids
    from nebula.pipeline.stage import load_recipe

    recipe, steps, mbs = load_recipe(cfg.recipe), cfg.train.steps, cfg.train.micro_batches
    a = ClusterStages(cfg, "A", recipe, ("embed",), 0, 0, 1, tmp_path)
    b = ClusterStages(cfg, "B", recipe, ("head",), 1, 0, 1, tmp_path)
    params = list(a.items[0].layer.parameters())
    drains = {s for s in range(1, steps + 1) if s == steps or s % cfg.checkpoint.every == 0}
    pending, losses = [], {}
    for k in range(steps):
        ids = step_ids(k, seed=cfg.train.seed, num_examples=recipe.num_examples, global_batch=cfg.train.global_batch)
        total = 0.0
        for mb in rank_micro_batches(ids, rank=0, world_size=1, micro_batches=mbs):
            h = a.forward(mb, None).send
            loss = b.forward(mb, h).loss / mbs
            loss.backward()
            total += float(loss.numpy())
        b.optimizer_step()
        losses[k] = total
        grads = [p.grad.numpy().copy() for p in params]
        a.clear_grad()
        pending.append(grads)
        while len(pending) > (0 if k + 1 in drains else cfg.train.stale_weights):
            for p, v in zip(params, pending.pop(0)):
                p._set_grad_ivar(paddle.to_tensor(v))
            a.optimizer_step()
    return losses
