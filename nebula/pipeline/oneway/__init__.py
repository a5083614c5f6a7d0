"""The one-way mode (Scenario I): sender clusters feed a receiver cluster's ranks through roots that scatter, with a
small sync tensor back after every step (`hooks`), the scatter plan and k (`plan`), and `k: auto` (`probe`)."""
from nebula.pipeline.oneway.hooks import OneWayHooks
from nebula.pipeline.oneway.plan import ScatterPlan, choose_k, plan_for, signatures_agree

__all__ = ["OneWayHooks", "ScatterPlan", "choose_k", "plan_for", "signatures_agree", "run_oneway"]


def run_oneway(cfg, cluster, *, wiring=None, workdir=None):  # noqa: ANN001,ANN201 - see run_stages
    """The one-way mode on the stage runner (`nebula.pipeline.runner.run_stages`)."""
    from nebula.pipeline.runner import run_stages

    return run_stages(cfg, cluster, OneWayHooks(), wiring=wiring, workdir=workdir)
