"""Between clusters: `allocation:` in the job file cuts the recipe's layers from the clusters' profiles."""
from __future__ import annotations

import numpy as np
import pytest

from nebula.config.schema import ConfigError
from nebula.config.job import load_job_config
from nebula.hybrid.bench import write_profiles
from nebula.hybrid.costs import analytic_layer_costs
from nebula.hybrid.plan import resolve_allocation
from recipes.toy import ToyRecipe
from tests.pipeline.helpers import TWO_STAGES, toy_job

LAYERS = 10


def _profiles(tmp_path, cluster: str, compute_s: float, ranks: int = 2) -> None:
    """A profiles file as nebula bench writes it: `ranks` ranks that each took `compute_s` on a 1 GFLOP probe."""
    write_profiles(tmp_path / "profiles" / f"{cluster}.yaml", cluster, "cpu",
                   [{"rank": r, "compute_s": compute_s, "probe_flops": 1e9, "free_memory_bytes": 8e9,
                     "latency_s": 1e-4, "bandwidth_bytes_per_s": 1e9} for r in range(ranks)])


def _job(tmp_path, allocation):
    return toy_job(tmp_path, clusters=[{"id": "A", "procs_per_node": 2}, {"id": "B", "procs_per_node": 2}],
                   stages=TWO_STAGES, recipe_args={"num_layers": LAYERS, "hidden": 64}, global_batch=32,
                   micro_batches=2, allocation=allocation)


def _best_cut(tpf_a: float, tpf_b: float, wan_s_per_byte: float, latency_s: float) -> int:
    """Brute force over every cut: the one minimising the slower cluster's time (ties: the earliest)."""
    costs = analytic_layer_costs(ToyRecipe(num_layers=LAYERS, hidden=64).layered(), 8, micro_batches=2)
    f = np.cumsum([0.0] + [c.flops for c in costs])
    best = min(range(1, LAYERS), key=lambda k: max(tpf_a * f[k] + latency_s + costs[k - 1].activation_bytes
                                                   * wan_s_per_byte, tpf_b * (f[-1] - f[k])))
    return best


@pytest.mark.parametrize("slow_b", [1.0, 3.0])
def test_allocation_in_the_job_file_cuts_where_brute_force_does(tmp_path, slow_b):
    _profiles(tmp_path, "A", 1.0)
    _profiles(tmp_path, "B", slow_b)
    cfg = resolve_allocation(load_job_config(_job(tmp_path, {"method": "optimal",
                                                             "wan": {"latency_ms": 5, "rate_mbit": 80}})))
    bounds = cfg.recipe.args["bounds"]
    want = _best_cut(1e-9 / 2, slow_b * 1e-9 / 2, 8 / 80e6, 5e-3)  # 2 data-parallel ranks share each stage
    assert bounds == [0, want, LAYERS]
    recipe = ToyRecipe(**cfg.recipe.args)
    assert recipe.stage_names == ("embed", "head") and recipe.stage("head").start == want


def test_slower_second_cluster_gets_fewer_layers(tmp_path):
    _profiles(tmp_path, "A", 100.0)  # slow enough that compute, not the default WAN's 30 ms, sets the cut
    _profiles(tmp_path, "B", 400.0)
    cut = resolve_allocation(load_job_config(_job(tmp_path, "optimal"))).recipe.args["bounds"][1]
    assert cut > LAYERS // 2  # the shorthand reads profiles/<cluster>.yaml and the default WAN


def test_allocation_bad_input_is_refused_with_the_fix(tmp_path):
    with pytest.raises(ConfigError, match="nebula bench job.yaml --cluster A"):
        resolve_allocation(load_job_config(_job(tmp_path, "optimal")))  # no profiles yet
    _profiles(tmp_path, "A", 1.0)
    _profiles(tmp_path, "B", 1.0)
    with pytest.raises(ConfigError, match="unknown allocation method 'fastest'"):
        resolve_allocation(load_job_config(_job(tmp_path, {"method": "fastest"})))
    with pytest.raises(ConfigError, match="holds the profiles of cluster 'A'"):
        resolve_allocation(load_job_config(_job(tmp_path, {"profiles": {"B": "profiles/A.yaml"}})))
    with pytest.raises(ConfigError, match="unknown key allocation.wan.bandwidth"):
        load_job_config(_job(tmp_path, {"wan": {"bandwidth": 3}}))


def test_a_cut_written_into_the_job_is_used_as_it_is(tmp_path):
    """`nebula allocate --write-job` writes method, devices and bounds: no profiles are needed then."""
    cfg = resolve_allocation(load_job_config(_job(tmp_path, {"method": "optimal", "devices": ["A", "B"],
                                                             "bounds": [0, 7, LAYERS], "bottleneck_s": 0.5})))
    assert cfg.recipe.args["bounds"] == [0, 7, LAYERS]
    with pytest.raises(ConfigError, match="not the job's clusters in stage order"):
        resolve_allocation(load_job_config(_job(tmp_path, {"devices": ["B", "A"], "bounds": [0, 7, LAYERS]})))
