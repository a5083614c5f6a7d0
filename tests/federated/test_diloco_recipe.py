"""The language-ID replica recipe of `mode: data_parallel` learns on real gettext messages (one cluster, in-process)."""
from __future__ import annotations

import pytest
import yaml

from nebula.config.job import load_job_config
from nebula.dataparallel import run_data_parallel
from recipes.federated.data import prepare
from recipes.federated.replica import heldout_of_checkpoint


@pytest.mark.slow
def test_langid_replica_learns_under_diloco_outer_steps(tmp_path):
    data = tmp_path / "langid.npz"
    prepare(data, langs=("de", "fr"), max_per_lang=200)
    doc = {"job": "dp-recipe", "mode": "data_parallel",
           "recipe": {"factory": "recipes.federated.replica:LangIdRecipe", "args": {"data": str(data), "hidden": 16}},
           "clusters": [{"id": "A"}], "train": {"steps": 30, "global_batch": 16, "seed": 1},
           "data_parallel": {"sync_every": 10, "outer": {"algorithm": "diloco"}},
           "checkpoint": {"dir": "ckpt"}, "metrics": {"dir": "metrics", "progress": False}}
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(doc))
    res = run_data_parallel(load_job_config(job), "A", workdir=tmp_path)
    assert res.end_step == 30
    first, last = sum(res.losses[s] for s in range(5)) / 5, sum(res.losses[s] for s in range(25, 30)) / 5
    assert last < 0.6 * first, (first, last)
    loss, acc = heldout_of_checkpoint(tmp_path / "ckpt" / "A" / "step_00000030", str(data), hidden=16)
    assert acc > 0.8 and loss < 0.6, (loss, acc)


def test_langid_recipe_names_missing_data_and_the_fix(tmp_path):
    from recipes.federated.replica import LangIdRecipe

    with pytest.raises(ValueError, match=r"does not exist; write it with .*prepare"):
        LangIdRecipe(data=str(tmp_path / "nope.npz"))
