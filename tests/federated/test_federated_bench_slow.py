"""The README's federated benchmarks run as printed and print their tables: the comparison with Flower (Nebula's
round time with the combiner on its switch's host and on another host, for every size; Flower's column where an
interpreter has `flwr`, else a line saying it was left out) and the same-host scale run (round time and switch
memory for every client count). The full comparison runs in CI as printed at its smallest size (NEBULA_SMOKE,
nebula/smoke.py), and at its full size in the slow tier. Figures are the benchmark's, not asserted."""
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
    _check_flower(command, run_printed(command))


@pytest.mark.slow
@pytest.mark.readme
@pytest.mark.timeout(600)
@pytest.mark.parametrize("command", [c for c in _printed_commands("--only flower") if c not in CI])
def test_the_full_flower_comparison_runs_as_printed_at_its_smallest_size(command):
    """CI's run of the full comparison as printed, at its smallest size (NEBULA_SMOKE: each size's model and
    clients cut down, benchmarks/federated.py): a row for every size, both placements measured."""
    _check_flower(command, run_printed(command, timeout_s=570, smallest=True), smallest=True)


def _check_flower(command: str, stdout: str, smallest: bool = False) -> None:
    """A row for each size `command` gives (`smallest`: distinct sizes no larger, in order), Nebula's round time
    measured with the combiner in both places; Flower's column measured, or one line saying why it was left out."""
    printed = re.search(r"--flower-sizes (\S+)", command).group(1).split(",")
    sizes = [tuple(int(x) for x in s.split("x")) for s in printed]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in stdout.splitlines()
            if re.match(r"\| \d+ \| \d+ \|", line)]
    ran = [(int(r[0]), int(r[1])) for r in rows]
    if smallest:
        assert len(ran) == len(sizes) == len(set(ran)), (ran, sizes)
        assert all(f <= pf and n <= pn for (f, n), (pf, pn) in zip(ran, sizes)), (ran, sizes)
    else:
        assert ran == sizes, (ran, sizes)
    for cells in rows:
        assert float(cells[2]) > 0 and float(cells[3]) > 0  # both placements measured
        measured = cells[4] != "-"
        assert measured != ("Flower: left out: flwr is not installed" in stdout), stdout[-3000:]


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
