"""Pipeline sections and layouts: bad input is refused before anything starts, with the fix in the message."""
from __future__ import annotations

import pytest

from nebula.config.schema import ConfigError
from nebula.config.job import load_job_config
from nebula.hybrid import Layout, RangeRecipe, check_bounds, shrink_layout
from recipes.toy import ToyRecipe
from tests.hybrid.helpers import hybrid_job


@pytest.mark.parametrize("pipeline, ranks, message", [
    ({"num_stages": 3}, 4, "4 ranks do not split into pipeline.num_stages=3"),
    ({"num_stages": 2, "bounds": [0, 4]}, 2, r"pipeline.bounds=\[0, 4\] must be 3 strictly increasing"),
    ({"num_stages": 2, "bounds": [0, 4, 4]}, 2, "strictly increasing"),
    ({"num_stages": 2, "slowdown": [1.0]}, 2, "pipeline.slowdown has 1 factors for 2 ranks"),
    ({"num_stages": 2, "slowdown": [1.0, 0.5]}, 2, "must hold factors >= 1"),
    ({"num_stages": 2, "stages": 2}, 2, "unknown key clusters.*pipeline.stages"),
])
def test_bad_pipeline_sections_are_refused(tmp_path, pipeline, ranks, message):
    with pytest.raises(ConfigError, match=message):
        load_job_config(hybrid_job(tmp_path, ranks=ranks, pipeline=pipeline))


def test_batch_must_split_over_replicas_not_ranks(tmp_path):
    # 4 ranks as 4 stages x 1 replica: 6 examples in 2 micro-batches is fine although 6 % (4 x 2) != 0
    assert load_job_config(hybrid_job(tmp_path, ranks=4, pipeline={"num_stages": 4}, global_batch=6))
    with pytest.raises(ConfigError, match="must divide evenly over 2 replicas x 2 micro-batches"):
        load_job_config(hybrid_job(tmp_path, ranks=4, pipeline={"num_stages": 2}, global_batch=6))


def test_layouts_and_shrinking():
    lay = Layout(2, 2)
    assert [lay.stage_of(r) for r in range(4)] == [0, 1, 0, 1] and lay.stage_ranks(1) == [1, 3]
    assert shrink_layout(lay, 3, 6) == Layout(3, 1)  # 3 ranks no longer split into 2 stages
    assert shrink_layout(lay, 2, 6) == Layout(2, 1)
    assert shrink_layout(Layout(4, 1), 3, 2) == Layout(1, 3)  # at most one stage per layer
    with pytest.raises(ValueError, match="no ranks left"):
        shrink_layout(lay, 0, 6)


def test_partition_index_checks_and_range_stages():
    assert check_bounds([0, 2, 6], 6, 2) == [0, 2, 6]
    with pytest.raises(ValueError, match="strictly increasing from 0 to 6"):
        check_bounds([0, 2, 5], 6)
    rec = RangeRecipe(ToyRecipe(num_layers=6).layered(), [0, 2, 6], ["embed", "head"])
    assert (rec.stage("head").start, rec.stage("head").stop) == (2, 6)
    with pytest.raises(ValueError, match="does not expose its layers"):
        from nebula.hybrid import layered_model

        layered_model(object())


@pytest.mark.parametrize("configured, device, ranks, cores, together", [
    (None, "cpu", 4, 2, True),  # ranks share the host's cores: timed together, as they will train
    (None, "cpu", 2, 2, False),  # a core each: each rank's own speed
    (None, "gpu", 8, 2, False),  # accelerators do not compute on the host's cores
    (False, "cpu", 4, 2, False),  # as configured
    (True, "gpu", 2, 16, True),
])
def test_probe_mode_follows_the_config_else_whether_ranks_share_cores(configured, device, ranks, cores, together):
    from nebula.hybrid.probe import probe_together

    assert probe_together(configured, device, ranks, cores) is together


def test_probe_together_is_unset_by_default_and_accepts_booleans_only(tmp_path):
    job = hybrid_job(tmp_path, ranks=2, pipeline={"num_stages": 2})
    assert load_job_config(job).cluster("A").pipeline.probe_together is None
    bad = hybrid_job(tmp_path, ranks=2, pipeline={"num_stages": 2, "probe_together": "yes"}, name="bad.yaml")
    with pytest.raises(ConfigError, match="probe_together"):
        load_job_config(bad)
