"""Federated mode (FEDn): aggregation math, strategies by name, the model trail, and the actors."""
from nebula.federated.aggregate import (RunningMean, check_update, check_updates, fedavg, krum, median, multi_krum,
                                        trimmed_mean)
from nebula.federated.strategy import AsyncStrategy, Strategy, get_strategy, register, strategy_names

__all__ = ["RunningMean", "check_update", "check_updates", "fedavg", "krum", "median", "multi_krum", "trimmed_mean",
           "AsyncStrategy", "Strategy", "get_strategy", "register", "strategy_names"]
