"""Layer pipelines inside a cluster (hybrid DP x PP) driven by an allocation, and the stage split between clusters.

A recipe exposes its model as layers (`LayeredModel`, via a `layered()` method); an allocation's partition index
(nebula.balance) cuts them into stages; `run_hybrid` trains one rank's stage under paddle.distributed.launch with
activations and gradients over paddle.distributed point-to-point and gradient all-reduce among each stage's
replicas; the device benchmark (`probe_ranks`) measures every rank; per-layer checkpoints let a job resume on a
new layout after ranks leave or join.
"""
from nebula.hybrid.layered import LayeredModel, LayerRangeStage, RangeRecipe, build_layers, check_bounds, layered_model
from nebula.hybrid.topology import Layout, shrink_layout

__all__ = [
    "LayeredModel",
    "LayerRangeStage",
    "RangeRecipe",
    "build_layers",
    "check_bounds",
    "layered_model",
    "Layout",
    "shrink_layout",
]
