"""The interface a recipe implements to run on the pipeline runtime: a `Recipe` of named `Stage`s.

A recipe splits one model into stages (e.g. ``("encoder", "decoder")``). The job file places each stage on a
cluster; every rank of that cluster builds the stage with `Stage.build_model` / `Stage.build_optimizer`, and for
each step and micro-batch the runtime hands it the example ids it must process. Each cluster reads only its own
data for those ids (`Stage.load`): ids come from one permutation drawn from the job's shared seed, so the encoder
cluster's source sentences and the decoder cluster's target sentences stay aligned without exchanging data.
`Stage.forward` takes the tensor received from the previous stage (None on the first stage) and returns the
tensor for the next stage or, on the last stage, the scalar loss (the mean over the micro-batch).
"""
from __future__ import annotations

import abc
import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    import paddle

__all__ = ["Recipe", "Stage", "StageContext", "StageOutput", "load_recipe"]


@dataclass(frozen=True, kw_only=True, slots=True)
class StageContext:
    """What a stage knows about where it runs."""

    job: str
    stage: str  # this stage's name
    stage_index: int  # position in the model (0 = first)
    num_stages: int
    cluster: str
    device: str  # cpu | gpu | npu | xpu (already set with paddle.set_device)
    rank: int  # rank inside this cluster
    world_size: int  # ranks of this cluster (data-parallel replicas)
    seed: int
    workdir: Path = field(default_factory=Path.cwd)  # directory of the job file (for recipe-relative data paths)

    @property
    def is_first(self) -> bool:
        """True on the model's first stage (no boundary tensor comes in)."""
        return self.stage_index == 0

    @property
    def is_last(self) -> bool:
        """True on the model's last stage (forward returns the loss)."""
        return self.stage_index == self.num_stages - 1


@dataclass(frozen=True, slots=True)
class StageOutput:
    """What `Stage.forward` may return when a plain tensor is not enough.

    `send`: tensor for the next stage (None on the last stage). `loss`: a scalar trained locally on this stage
    (the last stage's loss; in Scenario I also the sender's own loss, e.g. ELECTRA's generator MLM loss).
    A bare tensor returned by forward means `send` on non-last stages and `loss` on the last one. `metrics`
    (one-way mode): counts such as correct predictions per language, summed over a step's micro-batches.
    """

    send: "paddle.Tensor | None" = None
    loss: "paddle.Tensor | None" = None
    metrics: "dict[str, float] | None" = None  # per-micro-batch numbers the runtime sums per step into the metrics


class Stage(abc.ABC):
    """One stage of a model: its layers, its optimizer, its own data and its forward."""

    @abc.abstractmethod
    def build_model(self, ctx: StageContext) -> "paddle.nn.Layer":
        """Create this stage's layers; called after paddle.seed(job seed + stage index) on every rank."""

    @abc.abstractmethod
    def build_optimizer(self, model: "paddle.nn.Layer", ctx: StageContext) -> "paddle.optimizer.Optimizer":
        """Create the optimizer over `model.parameters()`."""

    @abc.abstractmethod
    def load(self, ids: np.ndarray, ctx: StageContext) -> Any:
        """Return this cluster's own inputs for example ids `ids` (None if the stage needs none)."""

    @abc.abstractmethod
    def forward(self, model: "paddle.nn.Layer", batch: Any,
                received: "paddle.Tensor | None") -> "paddle.Tensor | StageOutput":
        """Run the stage on one micro-batch; see StageOutput for what to return."""

    def signature(self, ctx: StageContext) -> dict[str, Any]:
        """What a peer stage must agree with before training (e.g. the vocabulary); compared key by key."""
        return {}


class Recipe(abc.ABC):
    """A model split into named stages plus the size of its training set (example ids 0..num_examples-1)."""

    stage_names: Sequence[str] = ()
    num_examples: int = 0

    @abc.abstractmethod
    def stage(self, name: str) -> Stage:
        """The stage called `name` (one of `stage_names`)."""


def load_recipe(spec: Any) -> Recipe:
    """Import and build the recipe named by a `RecipeSpec` ("module:attr" factory and its args)."""
    from nebula.config.schema import ConfigError

    mod_name, _, attr = spec.factory.partition(":")
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as exc:
        raise ConfigError(f"recipe.factory {spec.factory!r}: cannot import {mod_name} ({exc}); check the module "
                          "path") from exc
    try:
        factory = getattr(mod, attr)
    except AttributeError as exc:
        raise ConfigError(f"recipe.factory {spec.factory!r}: {mod_name} has no {attr!r}") from exc
    try:
        recipe = factory(**dict(spec.args))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"recipe.args for {spec.factory}: {exc}") from exc
    if not isinstance(recipe, Recipe):
        raise ConfigError(f"recipe.factory {spec.factory!r} returned {type(recipe).__name__}, not a "
                          "nebula.pipeline.Recipe")
    if not recipe.stage_names or recipe.num_examples < 1:
        raise ConfigError(f"recipe {spec.factory}: stage_names and num_examples must be set")
    return recipe
