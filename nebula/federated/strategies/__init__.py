"""Built-in aggregation strategies, one module per paper; importing this package registers them."""
from nebula.federated.strategies import (fedadagrad, fedasync, fedavg, fedbuff, fedopt, fedprox, krum,  # noqa: F401
                                         trimmed_mean)

__all__: list[str] = []
