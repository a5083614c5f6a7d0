"""Toy recipe: a small MLP classifier on synthetic data, split into 2 or more stages.

Data are a pure function of the example id and `data_seed`, so every cluster "reads its own data" for the ids
the runtime gives it: the first stage loads features, the last stage loads features' labels (from a fixed
teacher), exactly as an encoder cluster loads source text and a decoder cluster loads target text.
With ``oneway=True`` the first stage is a small classifier trained on its own loss that sends only its predicted
class ids (a few bytes, like ELECTRA's sampled tokens); the second stage uses them as extra input (Scenario I).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import paddle
import paddle.nn.functional as F

from nebula.hybrid import LayeredModel, RangeRecipe
from nebula.pipeline import Recipe, Stage, StageContext, StageOutput


def features(ids: np.ndarray, dim: int, data_seed: int) -> np.ndarray:
    """Deterministic features of example ids: one float32 row per id."""
    rows = [np.random.default_rng((data_seed, int(i))).standard_normal(dim) for i in ids]
    return np.asarray(rows, dtype="float32").reshape(len(ids), dim)


def labels(ids: np.ndarray, dim: int, classes: int, data_seed: int) -> np.ndarray:
    """Labels of a fixed random two-layer teacher applied to the features (learnable, not linear)."""
    rng = np.random.default_rng((data_seed, 2**40))  # a stream no example id reaches
    w1 = rng.standard_normal((dim, 2 * dim))
    w2 = rng.standard_normal((2 * dim, classes))
    return np.argmax(np.tanh(features(ids, dim, data_seed) @ w1) @ w2, axis=1).astype("int64")


class _Block(paddle.nn.Layer):
    def __init__(self, n_in: int, n_out: int, act: bool) -> None:
        super().__init__()
        self.fc = paddle.nn.Linear(n_in, n_out)
        self.act = act

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        y = self.fc(x)
        return paddle.tanh(y) if self.act else y


class ToyStage(Stage):
    """One slice of the toy MLP: first, middle or last (the last computes the cross-entropy loss)."""

    def __init__(self, recipe: "ToyRecipe", position: str) -> None:
        self.r = recipe
        self.position = position  # first | middle | last

    def build_model(self, ctx: StageContext) -> paddle.nn.Layer:
        """First: dim -> hidden; middle: hidden -> hidden; last: hidden -> classes; `depth` extra hidden layers."""
        r = self.r
        deep = [_Block(r.hidden, r.hidden, True) for _ in range(r.depth)]
        if self.position == "first":
            if r.oneway:
                return paddle.nn.Sequential(_Block(r.dim, r.hidden, True), *deep, _Block(r.hidden, r.classes, False))
            return paddle.nn.Sequential(_Block(r.dim, r.hidden, True), *deep)
        if self.position == "middle":
            return paddle.nn.Sequential(_Block(r.hidden, r.hidden, True), *deep)
        if r.oneway:
            return paddle.nn.Sequential(_Block(r.dim + r.classes, r.hidden, True), *deep,
                                        _Block(r.hidden, r.classes, False))
        return paddle.nn.Sequential(*deep, _Block(r.hidden, r.classes, False))

    def build_optimizer(self, model: paddle.nn.Layer, ctx: StageContext) -> paddle.optimizer.Optimizer:
        """Adam (its moments make resume-from-checkpoint tests meaningful), or plain SGD with optimizer='sgd'."""
        if self.r.optimizer == "sgd":
            return paddle.optimizer.SGD(learning_rate=self.r.lr, parameters=model.parameters())
        return paddle.optimizer.Adam(learning_rate=self.r.lr, parameters=model.parameters())

    def load(self, ids: np.ndarray, ctx: StageContext) -> Any:
        """Features on the first stage (and last, in oneway mode), labels on the last; nothing in between."""
        r = self.r
        out: dict[str, paddle.Tensor] = {}
        if self.position == "first" or (r.oneway and self.position == "last"):
            out["x"] = paddle.to_tensor(features(ids, r.dim, r.data_seed))
        if self.position == "last" or (r.oneway and self.position == "first"):
            out["y"] = paddle.to_tensor(labels(ids, r.dim, r.classes, r.data_seed))
        return out

    def forward(self, model: paddle.nn.Layer, batch: Any, received: paddle.Tensor | None) -> Any:
        """Run this slice; the last stage returns the mean cross-entropy of the micro-batch."""
        r = self.r
        if r.oneway:
            if self.position == "first":
                logits = model(batch["x"])
                return StageOutput(send=paddle.argmax(logits, axis=1), loss=F.cross_entropy(logits, batch["y"]))
            hint = F.one_hot(received, r.classes).astype("float32")
            return F.cross_entropy(model(paddle.concat([batch["x"], hint], axis=1)), batch["y"])
        h = model(batch["x"] if self.position == "first" else received)
        if self.position == "last":
            return F.cross_entropy(h, batch["y"])
        return h


class ToyLayers(LayeredModel):
    """The toy MLP as a list of layers: dim -> hidden, `num_layers - 2` hidden -> hidden, hidden -> classes."""

    def __init__(self, recipe: "ToyRecipe") -> None:
        self.r = recipe
        self.num_layers = recipe.num_layers
        self.num_examples = recipe.num_examples

    def build_layer(self, index: int) -> paddle.nn.Layer:
        """Layer `index`: the first reads the features, the last gives the class logits."""
        r = self.r
        if index == 0:
            return _Block(r.dim, r.hidden, True)
        if index == self.num_layers - 1:
            return _Block(r.hidden, r.classes, False)
        return _Block(r.hidden, r.hidden, True)

    def inputs(self, ids: np.ndarray) -> paddle.Tensor:
        """Features of `ids`."""
        return paddle.to_tensor(features(ids, self.r.dim, self.r.data_seed))

    def targets(self, ids: np.ndarray) -> paddle.Tensor:
        """Teacher labels of `ids`."""
        return paddle.to_tensor(labels(ids, self.r.dim, self.r.classes, self.r.data_seed))

    def loss(self, output: paddle.Tensor, targets: paddle.Tensor) -> paddle.Tensor:
        """Mean cross-entropy."""
        return F.cross_entropy(output, targets)

    def build_optimizer(self, parameters: list) -> paddle.optimizer.Optimizer:
        """Adam (per parameter, so any cut of the layers trains exactly like the whole)."""
        return paddle.optimizer.Adam(learning_rate=self.r.lr, parameters=parameters)


class ToyRecipe(Recipe):
    """Toy MLP in `num_stages` stages named embed, mid1..., head (with oneway=True: senders gen, or gen1, gen2, ...
    for several sender clusters, and the receiver disc).

    `depth` adds hidden layers to every stage (more compute per byte on the boundary, for benchmarks).
    `layered()` gives the MLP as `num_layers` layers (for allocation and in-cluster layer pipelines); with
    `bounds` (a partition index over those layers, e.g. chosen by an allocation) the stages are its ranges.
    """

    def __init__(self, *, dim: int = 8, hidden: int = 32, classes: int = 4, num_stages: int = 2,
                 num_examples: int = 4096, lr: float = 0.01, data_seed: int = 7, oneway: bool = False,
                 depth: int = 0, num_layers: int = 6, bounds: list[int] | None = None,
                 optimizer: str = "adam") -> None:
        if optimizer not in ("adam", "sgd"):
            raise ValueError(f"optimizer={optimizer!r} must be 'adam' or 'sgd'")
        self.optimizer = optimizer
        if num_layers < 2:
            raise ValueError(f"num_layers={num_layers} must be >= 2 (input and output layer)")
        self.num_layers = num_layers
        self.bounds = None
        if bounds is not None:
            num_stages = len(bounds) - 1
            self.bounds = list(bounds)
        if num_stages < 2:
            raise ValueError(f"num_stages={num_stages} must be >= 2")
        if oneway and bounds is not None:
            raise ValueError("bounds cut the layered MLP; oneway=True has its own two stages, drop one of them")
        self.dim, self.hidden, self.classes, self.lr = dim, hidden, classes, lr
        self.data_seed, self.oneway, self.depth = data_seed, oneway, depth
        self.num_examples = num_examples
        if oneway:  # every stage but the last is a sender (one per sender cluster, M3)
            self.stage_names = ("gen", "disc") if num_stages == 2 else (
                *(f"gen{i}" for i in range(1, num_stages)), "disc")
        else:
            self.stage_names = ("embed", *(f"mid{i}" for i in range(1, num_stages - 1)), "head")

    def layered(self) -> ToyLayers:
        """The MLP as `num_layers` layers."""
        return ToyLayers(self)

    def stage(self, name: str) -> Stage:
        """The stage called `name`."""
        if self.bounds is not None:
            return RangeRecipe(self.layered(), self.bounds, self.stage_names).stage(name)
        i = list(self.stage_names).index(name)
        pos = "first" if i == 0 else "last" if i == len(self.stage_names) - 1 else "middle"
        if self.oneway and pos == "middle":
            pos = "first"  # another sender
        return ToyStage(self, pos)
