"""The README's allocation benchmarks run as printed: `benchmarks/allocation.py` finds no fixed-order allocator
beating `optimal` on any instance, and `benchmarks/allocation_run.py` runs every method under every probe asked for on
real ranks, each on a cut of all the layers (run times, predictions and measured steps are the benchmark's, not
asserted)."""
from __future__ import annotations

import ast
import re

import pytest

from tests.harness.readme import printed_commands, run_printed

ALLOCATION = printed_commands("## Allocating layers to devices", "\n## ", "python benchmarks/allocation.py")
RUN = printed_commands("## Layer pipelines from an allocation", "\n## ", "python benchmarks/allocation_run.py")
PRINTED = ALLOCATION + RUN


@pytest.mark.slow
@pytest.mark.readme  # (under a minute each)
@pytest.mark.parametrize("command", ALLOCATION)
def test_no_allocator_beats_optimal_on_any_instance(command):
    stdout = run_printed(command)
    rows, ratios = [], False  # (rows of the tables of predicted time / optimal's, not of the run times)
    for line in stdout.splitlines():
        ratios = line.startswith("Predicted iteration time") or (ratios and "Run time of each allocator" not in line)
        m = re.match(r"(bert-\d+)\s+(\d+)\s+(\d+) \|\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)", line)
        if ratios and m:
            rows.append(m.groups())
    assert rows, stdout[-3000:]
    for model, devices, seed, even, sky, optimal in rows:
        assert float(optimal) == 1.0 and float(even) >= 1.0 and float(sky) >= 1.0, (model, devices, seed)
    assert re.search(r"optimal = 1\.00x the optimum on every instance: yes \(no fixed-order method beat it on any "
                     r"of \d+ instances: yes", stdout), stdout[-3000:]


@pytest.mark.slow
@pytest.mark.readme  # (one to two minutes each)
@pytest.mark.parametrize("command", RUN)
def test_every_method_runs_on_real_ranks_under_every_probe(command):
    stdout = run_printed(command)
    probes = re.search(r"--probe (\S+)", command)
    rows = re.findall(r"^(even|optimal)\s+(alone|together)\s+(\[[\d, ]+\])\s+([\d.]+)\s+([\d.]+)", stdout, re.M)
    assert {(m, p) for m, p, *_ in rows} == {(m, p) for m in ("even", "optimal")
                                             for p in (probes.group(1) if probes else "together").split(",")}
    for method, probe, bounds, predicted, measured in rows:
        cut = ast.literal_eval(bounds)
        assert cut[0] == 0 and cut[-1] == 16 and len(cut) == 5 and cut == sorted(cut), (method, probe, cut)
        assert float(predicted) > 0 and float(measured) > 0, (method, probe)
