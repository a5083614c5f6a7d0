"""`nebula allocate` profiles a library model's layers from its job file, and the job's `allocation:` cuts it
between clusters (the written cut) and inside a cluster (a layer pipeline over real paddle.distributed ranks)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from nebula.config.job import load_job_config
from nebula.hybrid.plan import resolve_allocation
from nebula.pipeline import read_metrics
from nebula.modes import run
from nebula.pipeline.stage import load_recipe
from tests.conftest import REPO
from tests.llm.conftest import NEEDS_FORMERS, ONE_PROCESS, TWO_CLUSTERS, llm_job
from testbed.federation import finish, launch

pytestmark = NEEDS_FORMERS
NEBULA = str(Path(sys.executable).parent / "nebula")
# cluster A's devices are 3x slower than B's: the allocator gives A fewer layers
DEVICES = """\
devices:
  - {name: A, flops_per_s: 1.0e+9, memory_bytes: 8.0e+9, latency_s: 0.02, bandwidth_bytes_per_s: 6.25e+6}
  - {name: B, flops_per_s: 3.0e+9, memory_bytes: 8.0e+9}
"""


def test_nebula_allocate_profiles_the_job_layers_and_the_written_cut_splits_the_model(tmp_path, llama_dir,
                                                                                       corpus_file):
    job = llm_job(tmp_path, llama_dir, corpus_file, clusters=[{"id": "A", "worker": "fed/A/worker.yaml"},
                                                              {"id": "B", "worker": "fed/B/worker.yaml"}],
                  stages=TWO_CLUSTERS)
    (tmp_path / "devices.yaml").write_text(DEVICES)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run([NEBULA, "allocate", "--model", str(job), "--devices", str(tmp_path / "devices.yaml"),
                          "--write-job", str(job)], capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert lines[0].startswith("method optimal: 7 layers on 2 devices")
    rows = {ln.split()[0]: ln.split() for ln in lines[2:4]}
    assert rows["A"][3] == "embed" and rows["B"][5] == "head"  # layers by name: first .. last
    a_layers, b_layers = int(rows["A"][2]), int(rows["B"][2])
    assert a_layers + b_layers == 7 and a_layers < b_layers  # the slower cluster holds fewer layers
    cut = yaml.safe_load(job.read_text())["allocation"]
    assert cut["devices"] == ["A", "B"] and cut["bounds"] == [0, a_layers, 7]
    # the job's allocation: cuts the recipe there: A trains embed + decoders, B the rest
    cfg = resolve_allocation(load_job_config(job))
    recipe = load_recipe(cfg.recipe)
    assert recipe.bounds == [0, a_layers, 7]
    embed, head = recipe.stage("embed"), recipe.stage("head")
    assert (embed.start, embed.stop, head.start, head.stop) == (0, a_layers, a_layers, 7)


@pytest.mark.slow  # two ranks probing and training: ~30 s on 2 busy cores
def test_a_cluster_layer_pipeline_cut_by_the_allocator_from_its_ranks_profiles(procs, tmp_path, llama_dir,
                                                                                corpus_file):
    """Two ranks of one cluster measure themselves, the optimal allocation cuts the model's layers between them,
    each rank reads the checkpoint outside the job's process group, and the pipeline trains exactly as one process
    on the same cut."""
    job = llm_job(tmp_path, llama_dir, corpus_file, steps=6, global_batch=8, micro_batches=2,
                  clusters=[{"id": "A", "procs_per_node": 2,
                             "pipeline": {"num_stages": 2, "allocation": "optimal", "slowdown": [1, 2]}}],
                  stages=ONE_PROCESS)
    code, out = finish(launch(procs, job, "A"), 300)
    assert code == 0, out[-3000:]
    recs = [read_metrics(tmp_path / "metrics" / f"A.rank{r}.jsonl") for r in (0, 1)]
    bounds = recs[0][0]["bounds"]
    assert recs[0][0]["method"] == "optimal" and len(bounds) == 3 and bounds[-1] == 7
    last = {r["step"]: r["loss"] for r in recs[1]}
    ref = run(load_job_config(llm_job(tmp_path / "ref", llama_dir, corpus_file, steps=6, clusters=[{"id": "A"}],
                                      stages=ONE_PROCESS, recipe_args={"bounds": bounds})), "A").losses
    np.testing.assert_allclose([last[s] for s in range(6)], [ref[s] for s in range(6)], rtol=1e-5, atol=1e-6)


def test_profiles_count_the_lm_head_as_the_matrix_product_it_is(llama_dir, corpus_file):
    from nebula.balance.profile import measure_layers
    from nebula.formers import CausalLMRecipe
    from nebula.hybrid.layered import build_layers

    m = CausalLMRecipe(from_pretrained=str(llama_dir), data=str(corpus_file), seq_len=24).layered()
    prof = measure_layers(build_layers(m, 0, m.num_layers, 0), m.inputs(np.arange(4)), names=m.names(), repeat=1)
    head = prof[-1]
    assert head.name == "head" and head.flops_source == "analytic"
    v, h = m.config.vocab_size, m.config.hidden_size
    assert head.flops == pytest.approx(3 * 2 * 4 * 24 * h * v)  # train step: 3 x forward of [4, 24, h] @ [h, v]
