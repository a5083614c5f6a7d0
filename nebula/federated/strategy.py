"""Aggregation strategies: a small interface, implementations registered by name (one module per paper).

A synchronous strategy is split as FEDn splits it: combiners reduce their clients' updates to one partial
model with its example count (`combine`; streaming strategies fold updates in one at a time), the reducer takes
the example-weighted mean of the partials and applies `server_step` (plain FedAvg returns that mean; FedAdam and
FedYogi take an optimiser step whose state is kept with the model). An asynchronous strategy applies each update
as it arrives (`on_update`), weighted by its staleness.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from nebula.federated.aggregate import Update, fedavg
from nebula.mean import Weights
from nebula.registry import Registry

__all__ = ["Strategy", "AsyncStrategy", "register_strategy", "get_strategy", "strategy_names", "State"]

State = dict[str, np.ndarray]

STRATEGIES: Registry[type["Strategy"]] = Registry("strategy")


def register_strategy(name: str) -> Callable[[type["Strategy"]], type["Strategy"]]:
    """Class decorator: make a strategy available to `get_strategy(name)` and to job files."""
    def deco(cls: type[Strategy]) -> type[Strategy]:
        cls.name = name
        return STRATEGIES.add(name, cls)
    return deco


def strategy_names() -> list[str]:
    """Names of the registered strategies."""
    return STRATEGIES.names()


def get_strategy(name: str, options: Mapping[str, Any] | None = None) -> "Strategy":
    """The strategy registered as `name`, built with `options`; ValueError names the known ones or the bad option."""
    cls = STRATEGIES.get(name)
    try:
        return cls(**dict(options or {}))
    except TypeError as exc:
        raise ValueError(f"strategy {name!r}: bad options {dict(options or {})} ({exc}); see "
                         f"{cls.__module__}.{cls.__name__} for the accepted ones") from None


class Strategy:
    """A synchronous strategy: combiner-level `combine` and reducer-level `server_step`."""

    name = "base"
    synchronous = True
    streaming = True  # combiners may fold updates in one at a time (RunningMean): one model's worth of memory

    def client_options(self) -> dict[str, Any]:
        """Options sent to clients with each training task (FedProx's mu, for one)."""
        return {}

    def combine(self, updates: Sequence[Update], clients: Sequence[str] | None = None) -> Weights:
        """One partial model from a combiner's updates (non-streaming strategies override this)."""
        return fedavg(updates, clients)

    def server_step(self, global_weights: Mapping[str, np.ndarray], mean: Mapping[str, np.ndarray],
                    state: State) -> tuple[Weights, State]:
        """The next global model from the current one and the example-weighted mean of the partials."""
        return {k: np.asarray(v) for k, v in mean.items()}, state

    def describe(self) -> dict[str, Any]:
        """Name and options, as stored in the model trail."""
        return {"name": self.name, **{k: v for k, v in vars(self).items() if not k.startswith("_")}}


class AsyncStrategy(Strategy):
    """An asynchronous strategy: every update is applied (or buffered) as it arrives."""

    synchronous = False

    def on_update(self, global_weights: Mapping[str, np.ndarray], base_weights: Mapping[str, np.ndarray],
                  update: Mapping[str, np.ndarray], num_examples: int, staleness: int,
                  state: State) -> tuple[Weights | None, State]:
        """Fold one update trained from `base_weights`, `staleness` versions old; the new model, or None."""
        raise NotImplementedError
