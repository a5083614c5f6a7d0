"""OWL (worker-assisted model distribution): the model's graph in segments, the approximation grouping and
deploying algorithms, and distribution where each worker pulls one group from the server and the rest from peers."""
from nebula.federated.owl.deploy import (SERVER, DeploySetting, Pull, centralized, deploy, estimate_round_s,
                                         server_only_round_s)
from nebula.federated.owl.graph import Base, Branch, GraphError, segments, topo_order
from nebula.federated.owl.grouping import all_groupings, group_branches, group_sizes

__all__ = ["SERVER", "DeploySetting", "Pull", "centralized", "deploy", "estimate_round_s", "server_only_round_s",
           "Base", "Branch", "GraphError", "segments", "topo_order", "all_groupings", "group_branches",
           "group_sizes"]
