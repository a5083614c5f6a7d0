"""README "Layer pipelines from an allocation", executed as printed: its two-cluster job.yaml is written as it
appears, the kits and switch servers it names (fed/A, fed/B) are provisioned and started, and its command block runs
in order: each cluster's `nebula bench` writes the profile that `allocation:` reads, and both clusters' `nebula
launch` train on the cut the allocator chose from them."""
from __future__ import annotations

import re
import shlex

import numpy as np
import pytest
import yaml

from nebula.pipeline import read_metrics
from tests.conftest import REPO
from testbed.federation import BIN, finish, start_switches

SECTION = "## Layer pipelines from an allocation"


def _blocks() -> tuple[str, list[str]]:
    """The section's two-cluster job (the yaml block that says it is job.yaml) and the command block after it."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    body = text[text.index(SECTION):]
    body = body[: body.index("\n## ", len(SECTION))]
    job = next(m for m in re.finditer(r"```yaml\n(# job\.yaml.*?)```", body, re.S))
    bash = re.search(r"```bash\n(.*?)```", body[job.end():], re.S).group(1)
    lines = [" ".join(ln.split(" #")[0].split()) for ln in bash.splitlines()]
    return job.group(1), [ln for ln in lines if ln and not ln.startswith("#")]


JOB, COMMANDS = _blocks()
BENCH = [c for c in COMMANDS if c.startswith("nebula bench ")]
LAUNCH = [c for c in COMMANDS if c.startswith("nebula launch ")]
PRINTED = BENCH + LAUNCH


@pytest.mark.slow
@pytest.mark.readme
@pytest.mark.timeout(1200)
def test_the_allocation_section_runs_as_printed(procs, tmp_path):
    assert BENCH == ["nebula bench job.yaml --cluster A --out profiles/A.yaml",
                     "nebula bench job.yaml --cluster B --out profiles/B.yaml"]
    assert LAUNCH == ["nebula launch job.yaml --cluster A", "nebula launch job.yaml --cluster B"]
    (tmp_path / "job.yaml").write_text(JOB)
    workers = start_switches(procs, tmp_path / "fed", ["A", "B"])
    assert {c: workers[c] for c in "AB"} == {c: tmp_path / "fed" / c / "worker.yaml" for c in "AB"}

    def start(command: str):
        words = shlex.split(command)
        return procs.start([str(BIN / words[0]), *words[1:]], cwd=str(tmp_path))

    for command in BENCH:  # each cluster's ranks measured, the profile written where allocation: reads it
        code, out = finish(start(command), 300)
        assert code == 0, f"{command}: exit {code}\n{out[-3000:]}"
        profile = yaml.safe_load((tmp_path / command.split("--out ")[1]).read_text())
        assert profile, command
    launched = [start(c) for c in LAUNCH]  # "on each cluster": both at once
    results = [finish(p, 300) for p in launched]
    for command, (code, out) in zip(LAUNCH, results):
        assert code == 0, f"{command}: exit {code}\n{out[-3000:]}"
    cuts = {re.search(r"allocation optimal: layers cut at (\[[\d, ]+\])", out).group(1) for _, out in results}
    assert len(cuts) == 1, cuts  # both launchers' preflights made the same cut
    steps = yaml.safe_load(JOB)["train"]["steps"]
    losses = [r["loss"] for r in read_metrics(tmp_path / "metrics" / "B.rank0.jsonl")]
    assert len(losses) == steps and np.mean(losses[-4:]) < np.mean(losses[:4])  # it trains across the cut
