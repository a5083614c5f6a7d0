"""Per-layer checkpoints: the pipelines' one format (nebula.pipeline.checkpoint) with one part per layer,
``layer_<i>``, so a job may resume on a different layout (other cut, other number of stages or replicas) after
ranks left or joined.

Each layer's part holds its weights and its share of the optimizer state (keyed by the parameter's structured name
inside the layer). The ranks of a cluster save their layers apart, so each part also holds ``files.json`` (its two
files' digests, written last by the rank that saved it); rank 0 commits the step once every stage has saved, with
the cluster's marker listing every layer file's digest.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from nebula.pipeline import checkpoint as pck
from nebula.pipeline.checkpoint import param_names, rename_state
from nebula.recovery import durable
from nebula.recovery.durable import CheckpointError

__all__ = ["layer_dir", "layer_parts", "save_layers", "commit", "committed_steps", "load_layers"]

_LAYER_FILES = "files.json"


def _part(index: int) -> str:
    return f"layer_{index:04d}"


def layer_parts(num_layers: int) -> list[str]:
    """The parts of a checkpoint of `num_layers` layers (what nebula.pipeline.checkpoint's `local_steps` and `prune`
    take as `parts`)."""
    return [_part(i) for i in range(num_layers)]


def layer_dir(root: str | Path, step: int, index: int) -> Path:
    """Directory of layer `index` in the checkpoint after `step` steps."""
    return pck.step_dir(root, step) / _part(index)


def save_layers(root: str | Path, step: int, first: int, layers: Sequence[Any], optimizer: Any) -> None:
    """Save layers first.. (their weights and their share of `optimizer`'s state) under step `step`, each layer's
    digests last."""
    state = optimizer.state_dict()
    for i, layer in enumerate(layers):
        d = layer_dir(root, step, first + i)
        (d / _LAYER_FILES).unlink(missing_ok=True)  # saved again: the layer counts once its new digests are in
        files = pck.save_part(d.parent, d.name, layer, rename_state(state, param_names(layer), only_named=True))
        durable.write_marker(d / _LAYER_FILES, {"files": {k.split("/", 1)[1]: v for k, v in files.items()}})


def commit(root: str | Path, step: int, cluster: str, meta: dict) -> Path:
    """Write the step's marker (after every stage saved its layers), listing every layer file's digest: the step
    now counts for resuming. CheckpointError if a layer's digests are missing or torn (its save did not finish)."""
    d = pck.step_dir(root, step)
    count = meta.get("num_layers")
    layers = [d / n for n in layer_parts(int(count))] if count is not None else sorted(d.glob("layer_*"))
    files = {}
    for layer in layers:
        if not (layer / _LAYER_FILES).is_file():
            raise CheckpointError(f"{layer} has no {_LAYER_FILES}: its save did not finish; step {step} is not "
                                  "committed")
        saved = durable.read_marker(layer / _LAYER_FILES).get("files", {})
        files.update({f"{layer.name}/{k}": v for k, v in saved.items()})
    return pck.commit_step(root, step, cluster, meta, files)


def committed_steps(root: str | Path | None, cluster: str, num_layers: int) -> list[int]:
    """Steps with a marker and every layer's weights matching its digest, oldest first (a step that does not
    verify is logged once and left out)."""
    return pck.local_steps(root, cluster, layer_parts(num_layers))


def load_layers(root: str | Path, step: int, first: int, layers: Sequence[Any], optimizer: Any) -> None:
    """Load layers first.. and their optimizer state from step `step` (saved by any layout); CheckpointError when a
    file does not match its marker's digest."""
    merged: dict = {}
    for i, layer in enumerate(layers):
        d = layer_dir(root, step, first + i)
        state, opt_state = pck.read_part(d.parent, d.name)
        layer.set_state_dict(state)
        if opt_state is not None:
            back = {v: k for k, v in param_names(layer).items()}
            merged.update(rename_state(opt_state, back, only_named=True))
    if merged:
        optimizer.set_state_dict(merged)
