"""Per-layer checkpoints: one directory per layer, so a job may resume on a different layout (other cut, other
number of stages or replicas) after ranks left or joined.

Layout: ``<dir>/step_<N>/layer_<i>/model.pdparams`` and ``optimizer.pdopt`` (that layer's optimizer state, keyed
by the parameter's structured name inside the layer), and ``<dir>/step_<N>/<cluster>.layers.json``, written last by
rank 0 once every stage has saved, which commits the step.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any, Sequence

from nebula.pipeline.checkpoint import param_names, rename_state

__all__ = ["layer_dir", "save_layers", "commit", "committed_steps", "load_layers", "prune", "read_marker"]


def _step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"step_{step:08d}"


def layer_dir(root: str | Path, step: int, index: int) -> Path:
    """Directory of layer `index` in the checkpoint after `step` steps."""
    return _step_dir(root, step) / f"layer_{index:04d}"


def save_layers(root: str | Path, step: int, first: int, layers: Sequence[Any], optimizer: Any) -> None:
    """Save layers first.. (their weights and their share of `optimizer`'s state) under step `step`."""
    import paddle

    state = optimizer.state_dict()
    for i, layer in enumerate(layers):
        d = layer_dir(root, step, first + i)
        d.mkdir(parents=True, exist_ok=True)
        paddle.save(layer.state_dict(), str(d / "model.pdparams"))
        paddle.save(rename_state(state, param_names(layer), only_named=True), str(d / "optimizer.pdopt"))


def commit(root: str | Path, step: int, cluster: str, meta: dict) -> Path:
    """Write the step's marker (after every stage saved its layers): the step now counts for resuming."""
    marker = _step_dir(root, step) / f"{cluster}.layers.json"
    tmp = marker.with_suffix(".tmp")
    tmp.write_text(json.dumps({**meta, "step": step, "cluster": cluster, "time": time.time()}))
    os.replace(tmp, marker)
    return marker


def read_marker(root: str | Path, step: int, cluster: str) -> dict:
    """The marker of a committed step (its layout, bounds and number of layers)."""
    return json.loads((_step_dir(root, step) / f"{cluster}.layers.json").read_text())


def committed_steps(root: str | Path | None, cluster: str, num_layers: int) -> list[int]:
    """Steps with a marker and every layer's weights, oldest first."""
    if not root or not Path(root).is_dir():
        return []
    out = []
    for d in Path(root).glob("step_*"):
        try:
            step = int(d.name[5:])
        except ValueError:
            continue
        if (d / f"{cluster}.layers.json").is_file() and \
                all((d / f"layer_{i:04d}" / "model.pdparams").is_file() for i in range(num_layers)):
            out.append(step)
    return sorted(out)


def load_layers(root: str | Path, step: int, first: int, layers: Sequence[Any], optimizer: Any) -> None:
    """Load layers first.. and their optimizer state from step `step` (saved by any layout)."""
    import paddle

    merged: dict = {}
    for i, layer in enumerate(layers):
        d = layer_dir(root, step, first + i)
        f = d / "model.pdparams"
        if not f.is_file():
            raise FileNotFoundError(f"checkpoint step {step} in {root} has no layer {first + i} ({f} is missing); "
                                    "it was written for another model: point checkpoint.dir elsewhere")
        layer.set_state_dict(paddle.load(str(f)))
        o = d / "optimizer.pdopt"
        if o.is_file():
            back = {v: k for k, v in param_names(layer).items()}
            merged.update(rename_state(paddle.load(str(o)), back, only_named=True))
    if merged:
        optimizer.set_state_dict(merged)


def prune(root: str | Path, cluster: str, num_layers: int, keep: int) -> None:
    """Remove all but the newest `keep` committed steps."""
    steps = committed_steps(root, cluster, num_layers)
    for step in steps[:-keep] if keep > 0 else steps:
        shutil.rmtree(_step_dir(root, step), ignore_errors=True)
