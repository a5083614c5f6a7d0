"""The README's pipeline step-time comparisons run as printed and print a row for every link rate, codec and weight
schedule asked for (figures are the benchmark's, not asserted)."""
from __future__ import annotations

import re

import pytest

from tests.harness.readme import printed_commands, run_printed

PRINTED = printed_commands("**The pipeline against its ideal step.**",
                           "**Federated rounds on the encrypted path against Flower.**",
                           ".venv/bin/python benchmarks/pipeline.py")


@pytest.mark.slow
@pytest.mark.readme
@pytest.mark.parametrize("command", PRINTED)
def test_the_step_time_comparison_runs_as_printed_with_a_row_per_configuration(command):
    stdout = run_printed(command)
    rates = re.search(r"--rates (\S+)", command)
    stale = re.search(r"--stale (\S+)", command)
    schedules = ["sync"] + [f"stale {n}" for n in (stale.group(1).split(",") if stale else [])]
    rows = {}
    for line in stdout.splitlines():
        m = re.match(r"\s*(\d+) Mb/s\s+(none|fp16/int8)\s+(sync|stale \d)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)",
                     line)
        if m:
            rows[m.group(1), m.group(2), m.group(3)] = [float(x) for x in m.groups()[3:]]
    want = {(r, c, s) for r in (rates.group(1) if rates else "5,10,60").split(",") for c in ("none", "fp16/int8")
            for s in schedules}
    assert set(rows) == want, stdout[-3000:]
    assert all(v > 0 for row in rows.values() for v in row)  # step, compute, wire and their ratio all measured
    assert "load average" in stdout
