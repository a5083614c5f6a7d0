"""What a client does to its update before it leaves, whichever way it answers a task (in the clear, or masked under
secure aggregation): without differential privacy it sends what it trained with its metrics (`AsTrained`); under
`differential_privacy` it clips its change from the round's model to `clip_norm` and adds its share of the noise
(`Privatize`), and neither evaluates the round's model nor sends a metric (they would fall outside what the
accountant counts). Both have the same methods, so a client's round calls them whatever its job file says;
`nebula.federated.client.client.task_answer` chooses one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from nebula.federated.privacy.mechanism import DPConfig, privatize_update, privatize_weights

__all__ = ["AsTrained", "Privatize"]

Evaluate = Callable[[Mapping[str, np.ndarray], Mapping[str, Any]], tuple[float, int, dict]]  # a Client's evaluate


@dataclass(frozen=True, slots=True)
class AsTrained:
    """No differential privacy: the round's model evaluated, the update and every metric sent as they are."""

    def evaluation(self, evaluate: Evaluate, params: Mapping[str, np.ndarray], config: Mapping[str, Any]) -> dict:
        """The client's evaluation of the round's model (`evaluate`: its `Client.evaluate`), as metrics."""
        loss, n_eval, em = evaluate(params, config)
        return {"eval_loss": loss, "eval_examples": n_eval, **em}

    def metrics(self, evaluated: dict, fitted: dict) -> dict | None:
        """The metrics that go with the update: the evaluation's and the training's."""
        return {**evaluated, **fitted}

    def weights(self, params: Mapping[str, np.ndarray], weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The weights sent: as trained."""
        return weights

    def change(self, change: np.ndarray, threshold: int) -> np.ndarray:
        """The change (one flat vector) masked under secure aggregation: as trained."""
        return change


@dataclass(frozen=True, slots=True, eq=False)
class Privatize:
    """Differential privacy (`dp`, the job's section): the change clipped and noised (from `rng`) before it leaves;
    no evaluation, no metric."""

    dp: DPConfig
    rng: np.random.Generator

    def evaluation(self, evaluate: Evaluate, params: Mapping[str, np.ndarray], config: Mapping[str, Any]) -> dict:
        """Nothing: no metric leaves the client (the accountant counts none), so the model is not evaluated."""
        return {}

    def metrics(self, evaluated: dict, fitted: dict) -> dict | None:
        """None: no metric goes with the update."""
        return None

    def weights(self, params: Mapping[str, np.ndarray], weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The round's model plus the change clipped and noised as the mode says; ValueError when `weights` is not
        shaped like the model (nothing unclipped leaves)."""
        return privatize_weights(self.dp, params, weights, self.rng)

    def change(self, change: np.ndarray, threshold: int) -> np.ndarray:
        """The change (one flat vector) clipped and noised, the noise split as the mode says among at least
        `threshold` clients (the secure sum's threshold, under distributed DP)."""
        return privatize_update({"change": change}, self.dp, self.rng, threshold)[0]["change"]
