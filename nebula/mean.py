"""A streaming weighted mean of models (`RunningMean`) and the check of one model against another
(`check_model_update`): what every runtime that averages models across processes shares (the federated combiners and
reducer, the data-parallel leaders).
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

__all__ = ["Weights", "RunningMean", "TensorSpec", "check_model_update"]

Weights = dict[str, np.ndarray]  # a model: parameter name -> array (what every runtime averages and sends)


def check_model_update(weights: Mapping[str, np.ndarray], num_examples: int, who: str,
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
            check_model_update(weights, num_examples, who)
            self.like = {k: (tuple(v.shape), v.dtype) for k, v in weights.items()}
        else:
            check_model_update(weights, num_examples, who, self.specs())
        self.begin(num_examples, who)
        for k, w in weights.items():
            self.add_part(k, w)

    def specs(self) -> dict[str, "TensorSpec"]:
        """Name -> (shape, dtype) of the model being averaged, usable as `like` in `check_model_update`."""
        return {k: TensorSpec(s, d) for k, (s, d) in (self.like or {}).items()}

    def result(self) -> dict[str, np.ndarray]:
        """The weighted mean of everything added so far; ValueError when nothing was."""
        if not self.num_updates:
            raise ValueError("no updates were added; the round has nothing to aggregate")
        return self.mean
