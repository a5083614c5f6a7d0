"""The LLM recipe's commands README.md and recipes/llm/README.md print, run as printed at their smallest size
(NEBULA_SMOKE=1: 12 steps, DiLoCo syncs every 4, 40 lines per language, 2 decoder layers): the recipe's script, then
`nebula allocate` in the run directory it wrote, on its pipeline job."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tests.llm.conftest import NEEDS_FORMERS
from tests.recipes.smallest import run_smallest, scratch_checkout

RUN_LOCAL = "bash recipes/llm/run_local.sh"  # README.md
ALLOCATE = "nebula allocate --model pipeline.yaml --devices devices.yaml --write-job pipeline.yaml"
PRINTED = [RUN_LOCAL, ALLOCATE]

pytestmark = [NEEDS_FORMERS, pytest.mark.slow, pytest.mark.readme, pytest.mark.timeout(1200)]
# devices.yaml, described in prose: cluster A's devices 3x slower than B's
DEVICES = """\
devices:
  - {name: A, flops_per_s: 1.0e+9, memory_bytes: 8.0e+9, latency_s: 0.02, bandwidth_bytes_per_s: 6.25e+6}
  - {name: B, flops_per_s: 3.0e+9, memory_bytes: 8.0e+9}
"""


def test_the_recipe_and_the_allocator_on_its_job_run_as_printed(tmp_path):
    checkout = scratch_checkout(tmp_path / "checkout")  # (its runs/ of its own)
    out = run_smallest(RUN_LOCAL, tmp_path / "logs", cwd=checkout)
    run = Path(re.search(r"run directory (\S+)", out).group(1))
    assert run.parent == checkout / "runs"
    # both modes trained across the two clusters, int8 at the cut and on the pseudo-gradients, the side-by-side table
    rows = {m: re.search(rf"^\| {m} \| 12 \| (\S+) -> (\S+) \| [\d,]+ \| ([\d.]+)x \|", out, re.M)
            for m in ("pipeline", "diloco")}
    assert all(rows.values()), out[-3000:]
    assert float(rows["pipeline"].group(3)) > 3.0
    assert (run / "loss.png").stat().st_size > 10_000

    (run / "devices.yaml").write_text(DEVICES)
    out = run_smallest(ALLOCATE, tmp_path / "logs", cwd=run)
    # the tiny model's layers (embed, decoder0..1, norm, head) cut between A and B, the slower A holding fewer
    assert out.startswith("method optimal: 5 layers on 2 devices"), out
    cut = yaml.safe_load((run / "pipeline.yaml").read_text())["allocation"]
    assert cut["devices"] == ["A", "B"] and cut["bounds"][0] == 0 and cut["bounds"][-1] == 5
    assert cut["bounds"][1] < 5 - cut["bounds"][1]
