"""The README's federated comparison with Flower runs as printed and prints its table: Nebula's round time with the
combiner on its switch's host and on another host, for every size (Flower's column where an interpreter has `flwr`;
figures are the benchmark's, not asserted)."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _printed_commands() -> list[str]:
    """Every Flower comparison the README's section prints (the full one, and the one of a single change)."""
    text = (REPO / "README.md").read_text()
    block = text[text.index("**Federated rounds on the encrypted path against Flower.**"):]
    block = block[:block.index("\n## ")]
    found = re.findall(r"`(PYTHONPATH=\. \.venv/bin/python benchmarks/federated\.py[^`]*)`", block, re.S)
    commands = [" ".join(f.split()) for f in found]  # (the README wraps them over two lines)
    commands = [c for c in commands if "--only flower" in c]
    assert commands, "the README names no federated benchmark command beside its Flower tables"
    return commands


@pytest.mark.slow
@pytest.mark.parametrize("command", _printed_commands())
def test_the_flower_comparison_runs_as_printed_and_prints_both_placements(command):
    env_part, *argv = shlex.split(command)
    env = {**os.environ, env_part.split("=")[0]: "."}
    out = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    assert out.returncode == 0, out.stderr[-3000:]
    sizes = re.search(r"--flower-sizes (\S+)", command).group(1).split(",")
    rows = [line for line in out.stdout.splitlines() if re.match(r"\| \d+ \| \d+ \|", line)]
    assert [f"{r.split('|')[1].strip()}x{r.split('|')[2].strip()}" for r in rows] == sizes
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert float(cells[2]) > 0 and float(cells[3]) > 0  # both placements measured
