"""Built-in aggregation strategies, one module per paper; importing this package registers them."""
from nebula.federated.strategies import fedasync, fedavg, fedbuff, fedopt, fedprox, krum, trimmed_mean  # noqa: F401

__all__: list[str] = []
