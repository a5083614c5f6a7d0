"""The outer step of cross-cluster data parallelism (pure numpy): plain averaging and DiLoCo's Nesterov momentum.

Every `sync_every` inner steps each cluster sends its pseudo-gradient D_c = anchor - replica_c (how far its replica
moved from the model all clusters last agreed on); the mean D over the clusters is the outer gradient. DiLoCo
(Douillard et al. 2023, Algorithm 1) applies SGD with Nesterov momentum to it, exactly as torch.optim.SGD does:

    buf    <- momentum * buf + D
    update <- D + momentum * buf   (Nesterov)   or   buf   (heavy ball)
    anchor <- anchor - lr * update

Plain periodic averaging is the same step with lr 1 and no momentum: anchor - mean(anchor - replica_c) is the
mean of the replicas.
"""
from __future__ import annotations

from typing import Mapping, NamedTuple

import numpy as np

from nebula.mean import Weights

__all__ = ["pseudo_gradient", "outer_step", "average_step", "OuterState", "pack_state", "unpack_state"]


def pseudo_gradient(anchor: Weights, replica: Weights) -> dict[str, np.ndarray]:
    """anchor - replica per tensor (ValueError naming the first key or shape that differs)."""
    if set(anchor) != set(replica):
        missing, extra = sorted(set(anchor) - set(replica)), sorted(set(replica) - set(anchor))
        raise ValueError(f"replica keys differ from the anchor's (missing {missing}, unexpected {extra})")
    out = {}
    for k, a in anchor.items():
        if a.shape != replica[k].shape:
            raise ValueError(f"{k!r}: replica shape {replica[k].shape} differs from the anchor's {a.shape}")
        out[k] = a - replica[k]
    return out


def outer_step(anchor: Weights, delta: Weights, buf: Mapping[str, np.ndarray] | None, *, lr: float,
               momentum: float, nesterov: bool = True) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(new anchor, new momentum buffer) after one SGD step with (Nesterov) momentum on pseudo-gradient `delta`.

    `buf` None is the zero buffer of the first outer step. Arrays keep the anchor's dtype.
    """
    if not lr > 0 or not 0 <= momentum < 1:
        raise ValueError(f"outer step: lr={lr} must be > 0 and momentum={momentum} in [0, 1)")
    new_anchor, new_buf = {}, {}
    for k, a in anchor.items():
        d = np.asarray(delta[k], dtype=a.dtype)
        if d.shape != a.shape:
            raise ValueError(f"{k!r}: pseudo-gradient shape {d.shape} differs from the model's {a.shape}")
        b = d.copy() if buf is None else momentum * buf[k] + d
        update = d + momentum * b if nesterov else b
        new_anchor[k] = (a - lr * update).astype(a.dtype, copy=False)
        new_buf[k] = b.astype(a.dtype, copy=False)
    return new_anchor, new_buf


def average_step(anchor: Weights, delta: Weights) -> dict[str, np.ndarray]:
    """anchor - delta: with `delta` the mean pseudo-gradient, the mean of the replicas."""
    return {k: (a - np.asarray(delta[k], dtype=a.dtype)).astype(a.dtype, copy=False) for k, a in anchor.items()}


class OuterState(NamedTuple):
    """What the outer optimizer carries between syncs: the agreed model, the momentum buffer, the last sync's step;
    with streaming (fragments synced in turn) the momentum of each fragment instead of `buf`, and the merges still
    due: (fragment, step after which it merges), each fragment's outer result being its slice of `anchor`."""

    anchor: dict[str, np.ndarray]
    buf: dict[str, np.ndarray] | None
    last_sync: int
    fragment_bufs: dict[int, np.ndarray] | None = None
    pending: tuple[tuple[int, int], ...] = ()


def pack_state(state: OuterState) -> dict[str, np.ndarray]:
    """`state` as flat named arrays (`anchor/<tensor>`, `buf/<tensor>`, `last_sync`; with streaming also
    `fbuf/<fragment>` and `pending`, rows of (fragment, merge step)) for a checkpoint."""
    out = {f"anchor/{k}": np.asarray(v) for k, v in state.anchor.items()}
    out.update({f"buf/{k}": np.asarray(v) for k, v in (state.buf or {}).items()})
    out.update({f"fbuf/{f}": np.asarray(v) for f, v in (state.fragment_bufs or {}).items()})
    out["last_sync"] = np.array(state.last_sync, dtype=np.int64)
    if state.fragment_bufs is not None or state.pending:
        out["pending"] = np.array(state.pending, dtype=np.int64).reshape(-1, 2)
    return out


def unpack_state(flat: Mapping[str, np.ndarray], like: Weights) -> OuterState:
    """The inverse of pack_state, checked against the model's tensors `like` (ValueError naming what differs)."""
    if "last_sync" not in flat:
        raise ValueError("the checkpoint's outer state has no last_sync: it was not written by mode data_parallel")
    parts: dict[str, dict[str, np.ndarray]] = {"anchor": {}, "buf": {}, "fbuf": {}}
    for key, v in flat.items():
        kind, _, name = key.partition("/")
        if kind in parts:
            parts[kind][name] = np.array(v)
    for kind in ("anchor", "buf") if parts["buf"] else ("anchor",):
        if set(parts[kind]) != set(like):
            raise ValueError(f"the checkpoint's outer {kind} holds tensors {sorted(parts[kind])} but the model has "
                             f"{sorted(like)}: it was saved by another model")
        for k, v in parts[kind].items():
            if v.shape != np.shape(like[k]):
                raise ValueError(f"the checkpoint's outer {kind} {k!r} has shape {v.shape}, the model's "
                                 f"{np.shape(like[k])}: it was saved by another model")
    fbufs = {int(f): v for f, v in parts["fbuf"].items()}
    streaming = "pending" in flat
    pending = tuple((int(f), int(s)) for f, s in np.asarray(flat["pending"]).reshape(-1, 2)) if streaming else ()
    return OuterState(parts["anchor"], parts["buf"] or None, int(flat["last_sync"]),
                      fbufs if streaming else None, pending)
