"""OWL (worker-assisted model distribution): the model's graph in segments, the approximation grouping and
deploying algorithms, and distribution where each worker pulls one group from the server and the rest from peers.

The Paddle side (`model`, `runtime`) loads on first use, so that reading a job file's `owl:` section
(nebula.federated.config) does not import Paddle."""
from __future__ import annotations

import importlib
from typing import Any

from nebula.federated.owl.config import OwlSpec
from nebula.federated.owl.deploy import (SERVER, DeploySetting, Pull, centralized, deploy, deploy_setting_for,
                                         estimate_round_s, server_only_round_s)
from nebula.federated.owl.graph import Base, Branch, GraphError, segments, topo_order
from nebula.federated.owl.grouping import all_groupings, group_branches, group_sizes

__all__ = ["OwlSpec", "SERVER", "DeploySetting", "Pull", "centralized", "deploy", "deploy_setting_for",
           "estimate_round_s", "server_only_round_s", "Base", "Branch", "GraphError", "segments", "topo_order",
           "all_groupings", "group_branches", "group_sizes", "OverlappedForward", "Parallel", "graph_of",
           "model_branches", "OwlError", "OwlResult", "OwlTask", "run_owl_worker", "serve_owl"]

_PADDLE_SIDE = {"OverlappedForward": "model", "Parallel": "model", "graph_of": "model", "model_branches": "model",
                "OwlError": "runtime", "OwlResult": "runtime", "OwlTask": "runtime",
                "run_owl_worker": "runtime", "serve_owl": "runtime"}


def __getattr__(name: str) -> Any:
    if name in _PADDLE_SIDE:
        return getattr(importlib.import_module(f"{__name__}.{_PADDLE_SIDE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
