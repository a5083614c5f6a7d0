"""A toy recipe whose first stage fails at its third batch: a rank that crashes mid-run (tests of `nebula launch`)."""
from __future__ import annotations

from typing import Any

import numpy as np

from recipes.toy.model import ToyRecipe, ToyStage

__all__ = ["FailingRecipe", "MESSAGE"]

MESSAGE = "toy stage: the data store went away at batch 3"


class _FailingStage(ToyStage):
    """ToyStage that raises on its third load."""

    loads = 0

    def load(self, ids: np.ndarray, ctx: Any) -> Any:
        self.loads += 1
        if self.loads >= 3:
            raise RuntimeError(MESSAGE)
        return super().load(ids, ctx)


class FailingRecipe(ToyRecipe):
    """ToyRecipe whose stages fail at their third batch."""

    def stage(self, name: str) -> ToyStage:
        stage = super().stage(name)
        stage.__class__ = _FailingStage
        return stage
