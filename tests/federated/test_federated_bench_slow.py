"""The README's federated benchmarks run as printed and print their tables: the comparison with Flower (Nebula's
round time with the combiner on its switch's host and on another host, for every size; Flower's column where an
interpreter has `flwr`) and the same-host scale run (round time and switch memory for every client count). Figures
are the benchmark's, not asserted."""
from __future__ import annotations

import re

import pytest

from tests.harness.readme import printed_commands, readme_tier, run_printed


def _printed_commands(flag: str) -> list[str]:
    """Every federated benchmark command with `flag` that the README's section prints (for Flower: the full
    comparison, and the one of a single change)."""
    return printed_commands("**Federated rounds on the encrypted path against Flower.**", "\n## ",
                            "PYTHONPATH=. .venv/bin/python benchmarks/federated.py", flag)


PRINTED = [*_printed_commands("--only flower"), *_printed_commands("--only scale")]
# the readme tier: one to two minutes each; slow only, the full comparison (the union of the first two sizes' runs)
CI = [f"PYTHONPATH=. .venv/bin/python benchmarks/federated.py --only flower --flower-sizes {sizes}"
      for sizes in ("1000000x10,1000000x50 --flower-rounds 5", "1000000x200,10000000x10 --flower-rounds 5",
                    "100000x3,100000x10,300000x10 --flower-rounds 6")] + [
    "PYTHONPATH=. .venv/bin/python benchmarks/federated.py --only scale --counts 100,200 --scale-size 1000000 "
    "--train-s 0 --scale-rounds 3"]
assert set(CI) <= set(PRINTED), sorted(set(CI) - set(PRINTED))  # (still printed)


@pytest.mark.slow
@pytest.mark.parametrize("command", readme_tier(_printed_commands("--only flower"), CI))
def test_the_flower_comparison_runs_as_printed_and_prints_both_placements(command):
    stdout = run_printed(command)
    sizes = re.search(r"--flower-sizes (\S+)", command).group(1).split(",")
    rows = [line for line in stdout.splitlines() if re.match(r"\| \d+ \| \d+ \|", line)]
    assert [f"{r.split('|')[1].strip()}x{r.split('|')[2].strip()}" for r in rows] == sizes
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert float(cells[2]) > 0 and float(cells[3]) > 0  # both placements measured


@pytest.mark.slow
@pytest.mark.parametrize("command", readme_tier(_printed_commands("--only scale"), CI))
def test_the_same_host_scale_run_runs_as_printed_and_measures_every_count(command):
    stdout = run_printed(command)
    counts = [int(c) for c in re.search(r"--counts (\S+)", command).group(1).split(",")]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in stdout.splitlines()
            if re.match(r"\| \d+ \| [\d.]+ \|", line)]
    assert [int(r[0]) for r in rows] == counts
    for row in rows:
        assert float(row[1]) > 0 and int(row[2]) == int(row[0])  # a round closed with every client's update
        assert float(row[-1]) > 0  # the switch's peak memory
