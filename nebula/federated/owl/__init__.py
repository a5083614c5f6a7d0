"""OWL (worker-assisted model distribution): the model's graph in segments, the approximation grouping and
deploying algorithms, and distribution where each worker pulls one group from the server and the rest from peers."""
from nebula.federated.owl.config import OwlSpec
from nebula.federated.owl.deploy import (SERVER, DeploySetting, Pull, centralized, deploy, estimate_round_s,
                                         server_only_round_s)
from nebula.federated.owl.graph import Base, Branch, GraphError, segments, topo_order
from nebula.federated.owl.grouping import all_groupings, group_branches, group_sizes
from nebula.federated.owl.model import OverlappedForward, Parallel, graph_of, model_branches
from nebula.federated.owl.runtime import OwlError, OwlResult, OwlTask, plan_for, run_owl_worker, serve_owl

__all__ = ["OwlSpec", "SERVER", "DeploySetting", "Pull", "centralized", "deploy", "estimate_round_s",
           "server_only_round_s", "Base", "Branch", "GraphError", "segments", "topo_order", "all_groupings",
           "group_branches", "group_sizes", "OverlappedForward", "Parallel", "graph_of", "model_branches",
           "OwlError", "OwlResult", "OwlTask", "plan_for", "run_owl_worker", "serve_owl"]
