"""Helpers of the hybrid tests: job files for an in-cluster layer pipeline and the unpartitioned reference."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from testbed.federation import finish, launch
from tests.pipeline.helpers import toy_job


def hybrid_job(tmp: Path, *, ranks: int, pipeline: dict[str, Any], steps: int = 2, global_batch: int = 24,
               micro_batches: int = 2, num_layers: int = 6, name: str = "job.yaml", **extra: Any) -> Path:
    """A one-cluster toy job whose `ranks` ranks run the layer pipeline `pipeline`."""
    return toy_job(tmp, clusters=[{"id": "A", "procs_per_node": ranks, "pipeline": pipeline}],
                   stages=[{"name": "embed", "cluster": "A"}, {"name": "head", "cluster": "A"}], steps=steps,
                   global_batch=global_batch, micro_batches=micro_batches, name=name,
                   recipe_args={"num_layers": num_layers, "hidden": 16}, **extra)


def reference_losses(*, steps: int, global_batch: int = 24, num_layers: int = 6, seed: int = 3) -> list[float]:
    """The unpartitioned toy model in this process: every layer, one Adam, the step's whole batch at once."""
    import paddle

    from nebula.pipeline.data import step_ids
    from recipes.toy import ToyRecipe

    paddle.set_device("cpu")
    model = ToyRecipe(num_layers=num_layers, hidden=16).layered()
    layers = []
    for i in range(model.num_layers):
        paddle.seed(seed + i)
        layers.append(model.build_layer(i))
    net = paddle.nn.Sequential(*layers)
    opt = model.build_optimizer(list(net.parameters()))
    out = []
    for step in range(steps):
        ids = step_ids(step, seed=seed, num_examples=model.num_examples, global_batch=global_batch)
        loss = model.loss(net(model.inputs(ids)), model.targets(ids))
        loss.backward()
        opt.step()
        opt.clear_grad()
        out.append(float(loss.numpy()))
    return out


def run_cluster(procs, job: Path, timeout_s: float = 240) -> str:
    """`nebula launch job --cluster A` to completion; its output (fails the test on a non-zero exit)."""
    code, out = finish(launch(procs, job, "A"), timeout_s)
    logs = "".join(p.read_text(errors="replace")[-3000:] for p in sorted((job.parent / "metrics" / "log").rglob("*"))
                   if p.is_file())
    assert code == 0, out[-3000:] + logs
    return out


def losses_of(metrics_file: Path) -> dict[int, float]:
    """step -> loss from one rank's metrics file."""
    from nebula.pipeline import read_metrics

    return {r["step"]: r["loss"] for r in read_metrics(metrics_file)}


def assert_same_losses(got: dict[int, float], ref: list[float], steps: range) -> None:
    """Every step in `steps` has the reference loss to float tolerance."""
    assert sorted(got) == list(steps), got
    np.testing.assert_allclose([got[s] for s in steps], [ref[s] for s in steps], rtol=1e-5, atol=1e-6)
