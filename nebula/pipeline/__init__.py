"""Cross-cluster stage runtime: stages on clusters, autograd-aware boundaries through the switch servers.

A recipe implements `Recipe` / `Stage` (see nebula.pipeline.stage); the job file (nebula.config.job) places its
stages on clusters; `nebula launch job.yaml --cluster C` starts that cluster's ranks, each of which runs the job's
mode (`nebula.modes.run`) on the `StageRunner` with that mode's `RunHooks`: `PipelineHooks` (Scenario II, here;
`StalePipelineHooks` with one-step-stale weights),
`OneWayHooks` (Scenario I, `nebula.pipeline.oneway`) or `DataParallelHooks` (`nebula.dataparallel`).
"""
from nebula.pipeline.data import rank_micro_batches, step_ids
from nebula.pipeline.hooks import PipelineHooks, RunHooks
from nebula.pipeline.links import ChannelLink, Link, PeerLost, QueueLink, queue_pair
from nebula.pipeline.metrics import MetricsWriter, read_metrics
from nebula.pipeline.oneway.plan import choose_k
from nebula.pipeline.runner import RunResult, StageRunner, Wiring, replace_steps, run_pipeline, run_stages
from nebula.pipeline.stale import StalePipelineHooks, WeightStash
from nebula.pipeline.stage import Recipe, Stage, StageContext, StageOutput, load_recipe

__all__ = [
    "Recipe",
    "Stage",
    "StageContext",
    "StageOutput",
    "load_recipe",
    "step_ids",
    "rank_micro_batches",
    "Link",
    "ChannelLink",
    "QueueLink",
    "queue_pair",
    "PeerLost",
    "StageRunner",
    "RunHooks",
    "PipelineHooks",
    "StalePipelineHooks",
    "WeightStash",
    "run_stages",
    "run_pipeline",
    "RunResult",
    "Wiring",
    "replace_steps",
    "MetricsWriter",
    "read_metrics",
    "choose_k",
]
