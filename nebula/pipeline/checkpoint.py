"""The checkpoint format of the layer pipelines (the stage runner and a cluster's hybrid DP x PP runner alike).

Layout: ``<dir>/step_<N>/<part>/model.pdparams`` and ``optimizer.pdopt`` for each part of the model (a stage of the
stage runner, or a layer, ``layer_<i>``, of nebula.hybrid.checkpoint), and ``<dir>/step_<N>/<cluster>.json``, the
cluster's marker, written last: it lists every file's SHA-256, so a step directory counts for a cluster only once
its marker exists and every file it lists matches. A mode with state beyond its parts (data_parallel's outer
optimizer) adds ``<dir>/step_<N>/<cluster>.extra.npz``, also written before the marker. An intra-cluster run writes
every stage in the same layout, which is what makes hot start of an inter-cluster run from it possible.

Every file is written under a temporary name, flushed and renamed into place (nebula.recovery.durable, through
security._files.atomic_write): a step whose files do not match its marker (a writer killed while saving the step
again, a damaged disk) is refused with one line and the newest older step that verifies is used instead. Markers
written before digests existed are taken as they are.
"""
from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from nebula.recovery import durable
from nebula.recovery.durable import CheckpointError

__all__ = ["step_dir", "marker_path", "save", "save_part", "commit_step", "read_step_marker", "read_part",
           "local_steps", "load", "load_extra", "prune", "checkpoint_step", "param_names", "rename_state",
           "CheckpointError"]

log = logging.getLogger(__name__)
MODEL_FILE, OPTIMIZER_FILE = "model.pdparams", "optimizer.pdopt"


def step_dir(root: str | Path, step: int) -> Path:
    """Directory of the checkpoint taken after `step` completed steps."""
    return Path(root) / f"step_{step:08d}"


def marker_path(d: str | Path, cluster: str) -> Path:
    """The marker that commits step directory `d` for `cluster`."""
    return Path(d) / f"{cluster}.json"


def _extra_path(d: Path, cluster: str) -> Path:
    return d / f"{cluster}.extra.npz"


def save_part(d: Path, name: str, layer: Any, optimizer_state: dict) -> dict[str, str]:
    """Write part `name` of step directory `d` (`layer`'s weights, then `optimizer_state`, keyed by structured
    parameter names); their digests by path inside the step, for the marker."""
    import paddle

    (d / name).mkdir(parents=True, exist_ok=True)
    return {f"{name}/{file}": durable.write_atomic(d / name / file, lambda p, s=state: paddle.save(s, str(p)))
            for file, state in ((MODEL_FILE, layer.state_dict()), (OPTIMIZER_FILE, optimizer_state))}


def commit_step(root: str | Path, step: int, cluster: str, meta: Mapping[str, Any],
                files: Mapping[str, str]) -> Path:
    """Write `cluster`'s marker of step `step`, listing `files` (path inside the step -> digest): the step now counts
    for resuming. The marker's path."""
    marker = marker_path(step_dir(root, step), cluster)
    durable.write_marker(marker, {**meta, "step": step, "cluster": cluster, "time": time.time(), "files": dict(files)})
    return marker


def read_step_marker(root: str | Path, step: int, cluster: str) -> dict:
    """`cluster`'s marker of step `step` (what its saver recorded: layout, bounds, number of layers, ...);
    CheckpointError when it is torn."""
    return durable.read_marker(marker_path(step_dir(root, step), cluster))


def save(root: str | Path, step: int, cluster: str, stages: dict[str, tuple[Any, Any]], meta: dict, *,
         extra: Mapping[str, Any] | None = None) -> Path:
    """Save each stage's (layer, optimizer) state and the `extra` arrays (by name), then the cluster's marker with
    every file's digest; returns the step directory."""
    import numpy as np

    d = step_dir(root, step)
    d.mkdir(parents=True, exist_ok=True)
    marker = marker_path(d, cluster)
    if marker.exists():  # the step is saved again (after resuming from an older one): uncommit it first
        marker.unlink()
        durable.sync_dir(d)
    files = {}
    for name, (layer, opt) in stages.items():
        files.update(save_part(d, name, layer, rename_state(opt.state_dict(), param_names(layer))))
    if extra is not None:
        arrays = {k: np.asarray(v) for k, v in extra.items()}

        def write_extra(p: Path) -> None:
            with open(p, "wb") as f:  # (a file object: np.savez would add .npz to a path)
                np.savez(f, **arrays)

        files[_extra_path(d, cluster).name] = durable.write_atomic(_extra_path(d, cluster), write_extra)
    commit_step(root, step, cluster, {**meta, "stages": sorted(stages)}, files)
    return d


def local_steps(root: str | Path | None, cluster: str, parts: Sequence[str], *, extra: bool = False) -> list[int]:
    """Steps for which this cluster has a committed checkpoint holding all of `parts` (and, with `extra`, its extra
    arrays), every file matching its marker's digest, oldest first. A step whose marker exists but whose files do
    not verify is logged once and left out (so the newest older step is used)."""
    def need(d: Path) -> list[str]:
        return [f"{n}/{MODEL_FILE}" for n in parts] + ([_extra_path(d, cluster).name] if extra else [])

    return durable.verified_steps(root, marker_path("", cluster).name, need, log, f"cluster {cluster}")


def checkpoint_step(d: str | Path) -> int:
    """The step recorded in a step directory's markers (any cluster's that reads whole)."""
    d = Path(d)
    for marker in sorted(d.glob("*.json")) if d.is_dir() else []:
        try:
            return int(durable.read_marker(marker)["step"])
        except (CheckpointError, KeyError, TypeError, ValueError):
            continue
    raise FileNotFoundError(f"{d} is not a checkpoint step directory (no readable <cluster>.json marker); point "
                            "checkpoint.init_from at a step_<N> directory")


def _digests(d: Path) -> tuple[dict[str, str], bool]:
    return durable.listed_digests(sorted(d.glob("*.json")) if d.is_dir() else [])


def read_part(d: str | Path, name: str, *, optimizer: bool = True) -> tuple[dict, dict | None]:
    """(weights, optimizer state or None) of part `name` of step directory `d`, each file checked against the
    markers' digests first. FileNotFoundError when the step has no such part, CheckpointError when a file does not
    match its digest."""
    import paddle

    d = Path(d)
    f = d / name / MODEL_FILE
    if not f.is_file():
        have = sorted(p.name for p in d.iterdir() if p.is_dir()) if d.is_dir() else []
        shown = have if len(have) <= 8 else have[:4] + ["...", *have[-2:]]
        raise FileNotFoundError(f"checkpoint {d} has no part {name!r} (it has {', '.join(shown) or 'nothing'}): it "
                                "was written for another model or layout; point the checkpoint elsewhere")
    digests, listed = _digests(d)
    durable.check_listed(d, f"{name}/{MODEL_FILE}", digests, listed)
    state = paddle.load(str(f))
    o = d / name / OPTIMIZER_FILE
    if not (optimizer and o.is_file()):
        return state, None
    durable.check_listed(d, f"{name}/{OPTIMIZER_FILE}", digests, listed)
    return state, paddle.load(str(o))


def load(d: str | Path, stages: dict[str, tuple[Any, Any]], *, optimizer: bool = True) -> int:
    """Load each stage's state from step directory `d`; returns its step. Missing stages raise FileNotFoundError,
    files that do not match their marker's digest CheckpointError."""
    d = Path(d)
    step = checkpoint_step(d)
    for name, (layer, opt) in stages.items():
        state, opt_state = read_part(d, name, optimizer=optimizer)
        _check_shapes(d, name, layer, state)
        layer.set_state_dict(state)
        if opt_state is not None:
            opt.set_state_dict(rename_state(opt_state, {v: k for k, v in param_names(layer).items()}))
    return step


def load_extra(d: str | Path, cluster: str) -> dict[str, Any] | None:
    """The `extra` arrays `cluster` saved into step directory `d` (None: it saved none)."""
    import numpy as np

    f = _extra_path(Path(d), cluster)
    if not f.is_file():
        return None
    durable.check_listed(Path(d), f.name, *_digests(Path(d)))
    with np.load(f, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def _check_shapes(d: Path, name: str, layer: Any, state: dict) -> None:
    """Refuse a checkpoint saved by a differently sized model (paddle would only warn and keep random weights)."""
    import numpy as np

    for key, param in layer.state_dict().items():
        if key not in state:
            raise ValueError(f"checkpoint {d} stage {name!r} lacks parameter {key}: it was saved by a different "
                             "model; point the checkpoint at a run of this model (same recipe, same preset)")
        got, want = list(np.shape(state[key])), list(param.shape)
        if got != want:
            raise ValueError(f"checkpoint {d} stage {name!r}: parameter {key} has shape {got} there but {want} in "
                             "this model: it was saved with another model size (preset); use the preset it was "
                             "trained with or a checkpoint of this one")


def prune(root: str | Path, cluster: str, parts: Sequence[str], keep: int) -> None:
    """Remove this cluster's files (marker, extra arrays, `parts`) from all but the newest `keep` of its checkpoints
    (and from older steps that never verified: saves cut short), then each step directory left empty."""
    steps = local_steps(root, cluster, parts)
    kept = steps[-keep:] if keep > 0 else []
    for d in sorted(Path(root).glob("step_*")):
        try:
            step = int(d.name[5:])
        except ValueError:
            continue
        if step in kept or (kept and step > kept[0]) or (not kept and step not in steps):
            continue
        marker_path(d, cluster).unlink(missing_ok=True)  # uncommitted first: a kill below leaves no half step
        _extra_path(d, cluster).unlink(missing_ok=True)
        for n in parts:
            shutil.rmtree(d / n, ignore_errors=True)
        # Clusters may share one checkpoint root (one machine, a shared file system): the other cluster can
        # remove the emptied directory or write into it between our check and rmdir; either way it is not ours.
        try:
            if not any(d.iterdir()):
                d.rmdir()
        except OSError:
            pass


def param_names(layer: Any) -> dict[str, str]:
    """Runtime parameter name (e.g. linear_7.w_0, depends on creation order) -> structured name (fc.weight)."""
    return {p.name: f"@{n}" for n, p in layer.named_parameters()}


def rename_state(state: dict, names: dict[str, str], *, only_named: bool = False) -> dict:
    """Rename optimizer state keys by their parameter-name prefix, so checkpoints load in any process; with
    `only_named`, keep just the entries of the parameters in `names` (one layer's share of the state)."""
    order = sorted(names, key=len, reverse=True)
    out = {}
    for key, value in state.items():
        old = next((o for o in order if key == o or key.startswith(o + "_")), None)
        if old is not None:
            out[names[old] + key[len(old):]] = value
        elif not only_named:
            out[key] = value
    return out
