"""Cross-cluster data parallelism (`mode: data_parallel`): every cluster trains a whole replica on its own data and the
clusters average every `sync_every` steps over the WAN, plainly or with DiLoCo's outer Nesterov step.

The outer math is pure (`outer`); the exchange is `allmean.ClusterMean`; `hooks.DataParallelHooks` is the mode on
the stage runner and `run_data_parallel` its entry point (`nebula launch` starts it through `nebula.modes`). With
`data_parallel.streaming` the model is synced in slices on their own schedules (Streaming DiLoCo, `streaming`).
"""
from nebula.dataparallel.outer import (OuterState, average_step, outer_step, pack_state, pseudo_gradient,
                                       unpack_state)

__all__ = ["OuterState", "average_step", "outer_step", "pack_state", "pseudo_gradient", "run_data_parallel",
           "unpack_state"]


def run_data_parallel(*args, **kwargs):  # noqa: ANN002,ANN003,ANN201 - late import: the runner imports paddle
    """See nebula.dataparallel.hooks.run_data_parallel."""
    from nebula.dataparallel.hooks import run_data_parallel as run

    return run(*args, **kwargs)
