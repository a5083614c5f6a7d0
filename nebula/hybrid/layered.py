"""A model as an ordered list of layers, so an allocation's partition index can cut it anywhere.

A recipe exposes its layers by a `layered()` method returning a `LayeredModel`. Layer `i` is always built right
after `paddle.seed(seed + i)`, so its initial weights do not depend on which stage, rank or layout builds it:
that is what makes a pipelined run reproduce the unpartitioned model's losses, and what lets a new layout load
per-layer checkpoints written by an old one.
"""
from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from nebula.pipeline.stage import Recipe, Stage, StageContext

if TYPE_CHECKING:  # pragma: no cover
    import paddle

__all__ = ["LayeredModel", "layered_model", "build_layers", "LayerRangeStage", "RangeRecipe", "check_bounds"]


class LayeredModel(abc.ABC):
    """A model as `num_layers` layers applied in order, with its data and loss."""

    num_layers: int = 0
    num_examples: int = 0

    @abc.abstractmethod
    def build_layer(self, index: int) -> "paddle.nn.Layer":
        """Create layer `index` (0-based); the caller has seeded paddle for it."""

    @abc.abstractmethod
    def inputs(self, ids: np.ndarray) -> "paddle.Tensor":
        """Input of layer 0 for example ids `ids`."""

    @abc.abstractmethod
    def targets(self, ids: np.ndarray) -> "paddle.Tensor":
        """What the loss compares the last layer's output with, for example ids `ids`."""

    @abc.abstractmethod
    def loss(self, output: "paddle.Tensor", targets: "paddle.Tensor") -> "paddle.Tensor":
        """Scalar loss of one micro-batch: the mean over its examples."""

    @abc.abstractmethod
    def build_optimizer(self, parameters: list) -> "paddle.optimizer.Optimizer":
        """An optimizer over `parameters` that acts per parameter (so a partitioned run equals the whole)."""


def layered_model(recipe: Any) -> LayeredModel:
    """The recipe's `LayeredModel`, or ValueError saying what the recipe must provide."""
    fn = getattr(recipe, "layered", None)
    if fn is None:
        raise ValueError(f"recipe {type(recipe).__name__} does not expose its layers: give it a layered() method "
                         "returning a nebula.hybrid.LayeredModel (see recipes/toy/model.py)")
    model = fn()
    if not isinstance(model, LayeredModel) or model.num_layers < 1:
        raise ValueError(f"{type(recipe).__name__}.layered() must return a nebula.hybrid.LayeredModel with "
                         f"num_layers >= 1, got {model!r}")
    return model


def check_bounds(bounds: Sequence[int], num_layers: int, num_stages: int | None = None) -> list[int]:
    """Validate a partition index (length D+1, 0 .. num_layers, strictly increasing); return it as a list."""
    b = [int(x) for x in bounds]
    want = "" if num_stages is None else f" of length {num_stages + 1}"
    if (num_stages is not None and len(b) != num_stages + 1) or len(b) < 2 or b[0] != 0 or b[-1] != num_layers \
            or any(x >= y for x, y in zip(b, b[1:])):
        raise ValueError(f"partition index {b} must be{want} strictly increasing from 0 to {num_layers} (the number "
                         "of layers), one range of at least one layer per stage")
    return b


def build_layers(model: LayeredModel, start: int, stop: int, seed: int) -> list:
    """Layers start..stop-1 of `model`, each built right after paddle.seed(seed + index)."""
    import paddle

    out = []
    for i in range(start, stop):
        paddle.seed(seed + i)
        out.append(model.build_layer(i))
    return out


class LayerRangeStage(Stage):
    """A pipeline `Stage` made of layers start..stop-1 of a `LayeredModel` (cuts chosen by an allocation)."""

    def __init__(self, model: LayeredModel, start: int, stop: int) -> None:
        self.model, self.start, self.stop = model, start, stop

    def build_model(self, ctx: StageContext) -> "paddle.nn.Layer":
        """The layers of this range in a Sequential, seeded per layer (independent of the cut)."""
        import paddle

        return paddle.nn.Sequential(*build_layers(self.model, self.start, self.stop, ctx.seed))

    def build_optimizer(self, model: "paddle.nn.Layer", ctx: StageContext) -> "paddle.optimizer.Optimizer":
        """The model's optimizer over this range's parameters."""
        return self.model.build_optimizer(list(model.parameters()))

    def load(self, ids: np.ndarray, ctx: StageContext) -> Any:
        """Inputs on the range holding layer 0, targets on the range holding the last layer."""
        out = {}
        if self.start == 0:
            out["x"] = self.model.inputs(ids)
        if self.stop == self.model.num_layers:
            out["y"] = self.model.targets(ids)
        return out

    def forward(self, model: "paddle.nn.Layer", batch: Any, received: "paddle.Tensor | None") -> Any:
        """Run the range; the last one returns the loss."""
        h = model(batch["x"] if self.start == 0 else received)
        return self.model.loss(h, batch["y"]) if self.stop == self.model.num_layers else h


class RangeRecipe(Recipe):
    """A recipe whose stages are the ranges of a partition index over a `LayeredModel`."""

    def __init__(self, model: LayeredModel, bounds: Sequence[int], names: Sequence[str]) -> None:
        self.bounds = check_bounds(bounds, model.num_layers, len(names))
        self.model = model
        self.stage_names = tuple(names)
        self.num_examples = model.num_examples

    def stage(self, name: str) -> Stage:
        """The range of stage `name`."""
        i = list(self.stage_names).index(name)
        return LayerRangeStage(self.model, self.bounds[i], self.bounds[i + 1])

    def layered(self) -> LayeredModel:
        """The whole layered model."""
        return self.model
