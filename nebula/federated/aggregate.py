"""Aggregation math (the federated ground floor, docs/architecture.md): pure functions over lists of
`(weights, num_examples)` and a streaming mean.

Every function checks its input first (`check_updates`): the same keys, shapes and floating dtypes in every
update, finite values, a positive example count. A bad update raises `ValueError` naming the client (its index,
or the name given in `clients`) and the problem.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

__all__ = ["Update", "check_update", "check_updates", "fedavg", "trimmed_mean", "median", "krum", "multi_krum",
           "RunningMean", "TensorSpec"]

Update = tuple[Mapping[str, np.ndarray], int]


def _who(i: int, clients: Sequence[str] | None) -> str:
    return f"client {clients[i]!r}" if clients is not None else f"update {i}"


def check_update(weights: Mapping[str, np.ndarray], num_examples: int, who: str,
                 like: Mapping[str, np.ndarray] | None = None) -> None:
    """Raise ValueError naming `who` unless `weights` is a finite float dict matching `like` (keys, shapes, dtypes)."""
    if not isinstance(weights, Mapping) or not weights:
        raise ValueError(f"{who}: weights must be a non-empty dict of name -> array, got {type(weights).__name__}; "
                         "send the model's state dict")
    if isinstance(num_examples, bool) or not isinstance(num_examples, (int, np.integer)) or num_examples <= 0:
        raise ValueError(f"{who}: num_examples={num_examples!r} must be a positive integer (the examples it "
                         "trained on)")
    if like is not None and set(weights) != set(like):
        missing, extra = sorted(set(like) - set(weights)), sorted(set(weights) - set(like))
        raise ValueError(f"{who}: keys differ from the global model's (missing {missing}, unexpected {extra}); "
                         "train the current global model without renaming its parameters")
    for name, w in weights.items():
        if not isinstance(w, np.ndarray):
            raise ValueError(f"{who}: {name!r} is a {type(w).__name__}, not a numpy array; convert it with .numpy()")
        if not np.issubdtype(w.dtype, np.floating):
            raise ValueError(f"{who}: {name!r} has dtype {w.dtype}, not a floating type; send float weights")
        if like is not None:
            ref = like[name]
            if w.shape != ref.shape:
                raise ValueError(f"{who}: {name!r} has shape {w.shape}, expected {ref.shape} (the global model's); "
                                 "train the current global model")
            if w.dtype != ref.dtype:
                raise ValueError(f"{who}: {name!r} has dtype {w.dtype}, expected {ref.dtype}; cast it back before "
                                 "sending")
        if not np.isfinite(w).all():
            raise ValueError(f"{who}: {name!r} holds NaN or Inf; lower the learning rate or clip gradients")


def check_updates(updates: Sequence[Update], clients: Sequence[str] | None = None,
                  like: Mapping[str, np.ndarray] | None = None) -> None:
    """Check a list of updates against each other (and `like`, when given); ValueError names the client."""
    if not updates:
        raise ValueError("no updates to aggregate; wait for at least one client")
    if clients is not None and len(clients) != len(updates):
        raise ValueError(f"{len(clients)} client names for {len(updates)} updates; give one name per update")
    for i, u in enumerate(updates):
        if not isinstance(u, tuple) or len(u) != 2:
            raise ValueError(f"{_who(i, clients)}: expected a (weights, num_examples) pair, got {type(u).__name__}")
        check_update(u[0], u[1], _who(i, clients), like if like is not None else (updates[0][0] if i else None))


def fedavg(updates: Sequence[Update], clients: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """Weighted mean, weights proportional to num_examples (McMahan et al., eq. 1 of FEDn)."""
    check_updates(updates, clients)
    total = float(sum(n for _, n in updates))
    out = {}
    for name, ref in updates[0][0].items():
        acc = np.zeros(ref.shape, np.float64)
        for w, n in updates:
            acc += w[name].astype(np.float64) * (n / total)
        out[name] = acc.astype(ref.dtype)
    return out


def _stack(updates: Sequence[Update], name: str) -> np.ndarray:
    return np.stack([w[name] for w, _ in updates])


def trimmed_mean(updates: Sequence[Update], trim_ratio: float = 0.1,
                 clients: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """Coordinate-wise trimmed mean (Yin et al. 2018): drop the floor(trim_ratio * n) largest and smallest values."""
    if not 0 <= trim_ratio < 0.5:
        raise ValueError(f"trim_ratio={trim_ratio} must be in [0, 0.5); 0.1 drops a tenth at each end")
    check_updates(updates, clients)
    k = int(math.floor(trim_ratio * len(updates)))
    out = {}
    for name, ref in updates[0][0].items():
        s = np.sort(_stack(updates, name), axis=0)
        out[name] = s[k:len(updates) - k].mean(axis=0, dtype=np.float64).astype(ref.dtype)
    return out


def median(updates: Sequence[Update], clients: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """Coordinate-wise median (Yin et al. 2018)."""
    check_updates(updates, clients)
    return {name: np.median(_stack(updates, name), axis=0).astype(ref.dtype) for name, ref in updates[0][0].items()}


def _krum_scores(updates: Sequence[Update], num_byzantine: int) -> np.ndarray:
    n = len(updates)
    flat = np.stack([np.concatenate([w[k].ravel().astype(np.float64) for k in sorted(w)]) for w, _ in updates])
    sq = (flat * flat).sum(axis=1)
    d = np.maximum(sq[:, None] + sq[None, :] - 2.0 * flat @ flat.T, 0.0)
    closest = n - num_byzantine - 2
    scores = np.empty(n)
    for i in range(n):
        others = np.delete(d[i], i)
        scores[i] = np.sort(others)[:closest].sum()
    return scores


def multi_krum(updates: Sequence[Update], num_byzantine: int, num_selected: int,
               clients: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """Multi-Krum (Blanchard et al. 2017): the plain mean of the `num_selected` updates with the lowest Krum score.

    The score of update i is the sum of squared distances to its n - f - 2 nearest other updates; n > 2f + 2.
    """
    check_updates(updates, clients)
    n = len(updates)
    if num_byzantine < 0 or n <= 2 * num_byzantine + 2:
        raise ValueError(f"Krum with num_byzantine={num_byzantine} needs more than {2 * num_byzantine + 2} updates, "
                         f"got {n}; lower num_byzantine or wait for more clients")
    if not 1 <= num_selected <= n:
        raise ValueError(f"num_selected={num_selected} must be between 1 and the {n} updates")
    chosen = np.argsort(_krum_scores(updates, num_byzantine), kind="stable")[:num_selected]
    out = {}
    for name, ref in updates[0][0].items():
        out[name] = np.mean([updates[i][0][name].astype(np.float64) for i in chosen], axis=0).astype(ref.dtype)
    return out


def krum(updates: Sequence[Update], num_byzantine: int, clients: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """Krum (Blanchard et al. 2017): the one update closest to its n - f - 2 nearest neighbours."""
    return multi_krum(updates, num_byzantine, 1, clients)


class TensorSpec:
    """Shape and dtype of one tensor (stands in for an array wherever only those are checked)."""

    __slots__ = ("shape", "dtype")

    def __init__(self, shape: Sequence[int], dtype: np.dtype) -> None:
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)


class RunningMean:
    """Incremental weighted mean: holds one model's worth of memory however many updates are added.

    `mean += (x - mean) * n / N` per tensor (or per slice of a tensor, so an update can arrive in pieces);
    combiners feed client updates, the reducer feeds combiner partials weighted by their example counts, which
    gives the same model as flat FedAvg over all clients.
    """

    def __init__(self, like: Mapping[str, np.ndarray] | None = None) -> None:
        self.like = {k: (tuple(v.shape), np.dtype(v.dtype)) for k, v in like.items()} if like is not None else None
        self.mean: dict[str, np.ndarray] = {}
        self.num_examples = 0
        self.num_updates = 0
        self._factor = 0.0
        self._seen: set[str] = set()

    def begin(self, num_examples: int, who: str = "update") -> None:
        """Start adding one update of `num_examples` examples (its tensors follow through `add_part`)."""
        if isinstance(num_examples, bool) or not isinstance(num_examples, (int, np.integer)) or num_examples <= 0:
            raise ValueError(f"{who}: num_examples={num_examples!r} must be a positive integer")
        self.num_examples += int(num_examples)
        self.num_updates += 1
        self._factor = num_examples / self.num_examples
        self._seen = set()

    def add_part(self, name: str, part: np.ndarray, offset: int = 0, adopt: bool = False) -> None:
        """Fold elements [offset, offset + part.size) of tensor `name` (flattened) of the current update in.

        With `adopt`, a whole tensor of the first update becomes the accumulator itself (no copy; the caller
        gives it up), so a combiner holds the running mean plus at most one update.
        """
        if self.like is None:
            raise ValueError("RunningMean needs `like` (the global model) to take updates in pieces")
        shape, dtype = self.like[name]
        acc = self.mean.get(name)
        if (acc is None and adopt and offset == 0 and part.dtype == dtype and part.size == int(np.prod(shape))
                and part.flags.writeable and part.flags.c_contiguous):
            self.mean[name] = part.reshape(shape)
            return
        if acc is None:
            acc = self.mean[name] = np.zeros(shape, dtype)
        flat = acc.reshape(-1)
        seg = flat[offset : offset + part.size]
        # in place: no temporary of the whole tensor, and one (not three) of this part
        step = np.subtract(part.reshape(-1), seg, dtype=dtype)
        step *= dtype.type(self._factor)
        seg += step

    def add(self, weights: Mapping[str, np.ndarray], num_examples: int, who: str = "update") -> None:
        """Fold one whole update in (checked against the first one, or against `like`)."""
        if self.like is None:
            check_update(weights, num_examples, who)
            self.like = {k: (tuple(v.shape), v.dtype) for k, v in weights.items()}
        else:
            check_update(weights, num_examples, who, self.specs())
        self.begin(num_examples, who)
        for k, w in weights.items():
            self.add_part(k, w)

    def specs(self) -> dict[str, "TensorSpec"]:
        """Name -> (shape, dtype) of the model being averaged, usable as `like` in `check_update`."""
        return {k: TensorSpec(s, d) for k, (s, d) in (self.like or {}).items()}

    def result(self) -> dict[str, np.ndarray]:
        """The weighted mean of everything added so far; ValueError when nothing was."""
        if not self.num_updates:
            raise ValueError("no updates were added; the round has nothing to aggregate")
        return self.mean
