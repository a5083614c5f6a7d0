"""FedProx (Li et al., 2020): FedAvg on the server, a proximal term (mu/2)·||w - w_global||² in each client's loss."""
from __future__ import annotations

from typing import Any

from nebula.federated.strategy import Strategy, register_strategy

__all__ = ["FedProx"]


@register_strategy("fedprox")
class FedProx(Strategy):
    """The server averages as FedAvg; clients add the proximal term with this `mu` (nebula.federated.client)."""

    def __init__(self, mu: float = 0.01) -> None:
        if not mu >= 0:
            raise ValueError(f"fedprox mu={mu} must be >= 0 (0 is FedAvg; the paper tries 0.001 to 1)")
        self.mu = float(mu)

    def client_options(self) -> dict[str, Any]:
        return {"proximal_mu": self.mu}
