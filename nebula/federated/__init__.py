"""Federated mode (FEDn): aggregation math, strategies by name, the model trail, the job file and the client API.

The actors (controller with the reducer, combiners, the client loop) live in `nebula.federated.controller`,
`.combiner`, `.client`, speak the message families of `.messages` (on `nebula.messaging`), and start through
`nebula.federated.run` or `nebula fl start` (`nebula.modes`). Two further algorithms build on them, chosen by the job
file's `algorithm:` and run by `.actors`: `nebula.federated.fedoptima` (FedOptima: device-side auxiliary networks,
a server trained from a bounded activation queue, asynchronous aggregation) and `nebula.federated.owl` (OWL:
worker-assisted model distribution).
"""
from nebula.federated.aggregate import check_updates, fedavg, krum, median, multi_krum, trimmed_mean
from nebula.federated.client import Client, PaddleClient
from nebula.federated.config import FederatedJob, load_federated_job
from nebula.federated.strategy import AsyncStrategy, Strategy, get_strategy, register_strategy, strategy_names
from nebula.federated import strategies as _builtin_strategies  # noqa: F401,E402  (registers FedAvg, FedProx, ...)
from nebula.federated.controller.trail import ModelTrail
from nebula.mean import RunningMean, check_model_update

__all__ = ["RunningMean", "check_model_update", "check_updates", "fedavg", "krum", "median", "multi_krum",
           "trimmed_mean", "AsyncStrategy", "Strategy", "get_strategy", "register_strategy", "strategy_names", "Client",
           "PaddleClient", "FederatedJob", "load_federated_job", "ModelTrail"]
