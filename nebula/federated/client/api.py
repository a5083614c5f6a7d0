"""The client API users write against (as in Flower: `fit` and `evaluate`); the loops that serve it live in
`.client` (plain rounds) and `.secure` (secure aggregation)."""
from __future__ import annotations

from typing import Any, Mapping

from nebula.mean import Weights

__all__ = ["Client"]


class Client:
    """A federated client. Subclass it: `get_parameters`, `fit` and `evaluate` (Flower's names and returns)."""

    def num_examples(self) -> int:
        """Training examples this client holds (the validity policy counts them)."""
        raise NotImplementedError

    def get_parameters(self, config: Mapping[str, Any]) -> Weights:
        """The local model's weights (asked once, to initialise an empty trail)."""
        raise NotImplementedError

    def fit(self, parameters: Weights, config: Mapping[str, Any]) -> tuple[Weights, int, dict]:
        """Train from `parameters` on local data: (new weights, examples used, metrics)."""
        raise NotImplementedError

    def evaluate(self, parameters: Weights, config: Mapping[str, Any]) -> tuple[float, int, dict]:
        """Evaluate `parameters` on local held-out data: (loss, examples, metrics)."""
        raise NotImplementedError
