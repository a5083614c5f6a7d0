"""The LLM recipe from its one command: both modes across two clusters through shaped switch servers, the
side-by-side table, the loss curves and VisualDL scalars per mode and cluster."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from nebula.logbook import read_scalars
from tests.conftest import REPO
from tests.llm.conftest import NEEDS_FORMERS

pytestmark = NEEDS_FORMERS


@pytest.mark.slow  # two two-cluster jobs and the data (~1 min on 2 busy cores)
def test_run_local_trains_both_modes_and_writes_the_table_curves_and_scalars(tmp_path):
    env = dict(os.environ, PY=sys.executable, STEPS="12", SYNC="4", PER_LANG="40", LAYERS="2", RATE_MBIT="200",
               PYTHONPATH=str(REPO))
    out = subprocess.run(["bash", str(REPO / "recipes/llm/run_local.sh"), str(tmp_path / "run")], env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    run = tmp_path / "run"
    table = (run / "summary.md").read_text()
    rows = {ln.split("|")[1].strip(): ln.split("|") for ln in table.splitlines() if ln.startswith("| pipeline")
            or ln.startswith("| diloco")}
    assert set(rows) == {"pipeline", "diloco"}
    first, last = (float(x) for x in rows["pipeline"][3].split("->"))
    assert last < first
    assert float(rows["pipeline"][5].strip(" x")) > 3.0  # int8 at the cut
    assert (run / "loss.png").stat().st_size > 10_000
    for mode in ("pipeline", "diloco"):
        for cluster in ("A", "B"):
            got = read_scalars(run / "vdl" / mode / cluster)
            assert len(got["steps_per_s"]) == 12 and len(got["wan_bytes"]) == 12
    assert len(read_scalars(run / "vdl" / "diloco" / "A")["compression_ratio"]) == 3  # one per sync
