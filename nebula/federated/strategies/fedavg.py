"""FedAvg (McMahan et al., 2017): the example-weighted mean of the clients' models."""
from __future__ import annotations

from nebula.federated.strategy import Strategy, register_strategy

__all__ = ["FedAvg"]


@register_strategy("fedavg")
class FedAvg(Strategy):
    """Weighted mean at the combiners and at the reducer; the global model is that mean."""
