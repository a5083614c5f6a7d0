"""Per-layer checkpoints: one directory per layer, so a job may resume on a different layout (other cut, other
number of stages or replicas) after ranks left or joined.

Layout: ``<dir>/step_<N>/layer_<i>/model.pdparams`` and ``optimizer.pdopt`` (that layer's optimizer state, keyed
by the parameter's structured name inside the layer), ``layer_<i>/files.json`` (the two files' SHA-256, written by
the rank that saved the layer), and ``<dir>/step_<N>/<cluster>.layers.json``, written last by rank 0 once every
stage has saved, which commits the step and lists every layer file's digest. Every file is written under a
temporary name, flushed and renamed into place (nebula.recovery.durable); a step whose files do not match its marker
is refused with one line and the newest older step that verifies is used.
"""
from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path
from typing import Any, Sequence

from nebula.pipeline.checkpoint import param_names, rename_state
from nebula.recovery import durable
from nebula.recovery.durable import CheckpointError

__all__ = ["layer_dir", "save_layers", "commit", "committed_steps", "load_layers", "prune", "read_marker"]

log = logging.getLogger(__name__)
_LAYER_FILES = "files.json"


def _step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"step_{step:08d}"


def layer_dir(root: str | Path, step: int, index: int) -> Path:
    """Directory of layer `index` in the checkpoint after `step` steps."""
    return _step_dir(root, step) / f"layer_{index:04d}"


def save_layers(root: str | Path, step: int, first: int, layers: Sequence[Any], optimizer: Any) -> None:
    """Save layers first.. (their weights and their share of `optimizer`'s state) under step `step`, each layer's
    digests last."""
    import paddle

    state = optimizer.state_dict()
    for i, layer in enumerate(layers):
        d = layer_dir(root, step, first + i)
        d.mkdir(parents=True, exist_ok=True)
        (d / _LAYER_FILES).unlink(missing_ok=True)  # saved again: the layer counts once its new digests are in
        files = {}
        for name, obj in (("model.pdparams", layer.state_dict()),
                          ("optimizer.pdopt", rename_state(state, param_names(layer), only_named=True))):
            files[name] = durable.write_atomic(d / name, lambda p, o=obj: paddle.save(o, str(p)))
        durable.write_marker(d / _LAYER_FILES, {"files": files})


def commit(root: str | Path, step: int, cluster: str, meta: dict) -> Path:
    """Write the step's marker (after every stage saved its layers), listing every layer file's digest: the step
    now counts for resuming. CheckpointError if a layer's digests are missing or torn (its save did not finish)."""
    d = _step_dir(root, step)
    marker = d / f"{cluster}.layers.json"
    files = {}
    count = meta.get("num_layers")
    layers = [layer_dir(root, step, i) for i in range(int(count))] if count is not None else sorted(d.glob("layer_*"))
    for layer in layers:
        doc = durable.read_marker(layer / _LAYER_FILES) if (layer / _LAYER_FILES).is_file() else None
        if doc is None:
            raise CheckpointError(f"{layer} has no {_LAYER_FILES}: its save did not finish; step {step} is not "
                                  "committed")
        files.update({f"{layer.name}/{k}": v for k, v in doc.get("files", {}).items()})
    durable.write_marker(marker, {**meta, "step": step, "cluster": cluster, "time": time.time(), "files": files})
    return marker


def read_marker(root: str | Path, step: int, cluster: str) -> dict:
    """The marker of a committed step (its layout, bounds and number of layers)."""
    return durable.read_marker(_step_dir(root, step) / f"{cluster}.layers.json")


def committed_steps(root: str | Path | None, cluster: str, num_layers: int) -> list[int]:
    """Steps with a marker and every layer's weights matching its digest, oldest first (a step that does not
    verify is logged once and left out)."""
    need = [f"layer_{i:04d}/model.pdparams" for i in range(num_layers)]
    return durable.verified_steps(root, f"{cluster}.layers.json", lambda d: need, log, f"cluster {cluster}")


def load_layers(root: str | Path, step: int, first: int, layers: Sequence[Any], optimizer: Any) -> None:
    """Load layers first.. and their optimizer state from step `step` (saved by any layout); CheckpointError when a
    file does not match its marker's digest."""
    import paddle

    step_d = _step_dir(root, step)
    digests, listed = durable.listed_digests(sorted(step_d.glob("*.layers.json")))
    merged: dict = {}
    for i, layer in enumerate(layers):
        d = layer_dir(root, step, first + i)
        f = d / "model.pdparams"
        if not f.is_file():
            raise FileNotFoundError(f"checkpoint step {step} in {root} has no layer {first + i} ({f} is missing); "
                                    "it was written for another model: point checkpoint.dir elsewhere")
        durable.check_listed(step_d, f"{d.name}/model.pdparams", digests, listed)
        layer.set_state_dict(paddle.load(str(f)))
        o = d / "optimizer.pdopt"
        if o.is_file():
            durable.check_listed(step_d, f"{d.name}/optimizer.pdopt", digests, listed)
            back = {v: k for k, v in param_names(layer).items()}
            merged.update(rename_state(paddle.load(str(o)), back, only_named=True))
    if merged:
        optimizer.set_state_dict(merged)


def prune(root: str | Path, cluster: str, num_layers: int, keep: int) -> None:
    """Remove all but the newest `keep` committed steps (and older steps that never verified)."""
    steps = committed_steps(root, cluster, num_layers)
    if not steps:
        return
    kept = steps[-keep:] if keep > 0 else []
    for d in Path(root).glob("step_*"):
        try:
            step = int(d.name[5:])
        except ValueError:
            continue
        if step in kept or (kept and step > kept[0]):
            continue
        (d / f"{cluster}.layers.json").unlink(missing_ok=True)  # uncommitted first: a kill below leaves no half step
        shutil.rmtree(d, ignore_errors=True)
