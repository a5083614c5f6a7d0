"""The README's relay comparisons run as printed and print their tables (figures are the benchmark's, not
asserted): every `benchmarks/relay.py --vs-tunnels` and `--sustained` command its speed section prints."""
from __future__ import annotations

import re

import pytest

from tests.harness.readme import printed_commands, run_printed


def _printed_commands() -> list[str]:
    return printed_commands("**The switch path against a C tunnel.**", "**The pipeline against its ideal step.**",
                            ".venv/bin/python benchmarks/relay.py --")


@pytest.mark.slow
@pytest.mark.parametrize("command", [c for c in _printed_commands() if "--sustained" in c])
def test_sustained_streams_print_every_repetition_and_the_arena_share(command):
    stdout = run_printed(command)
    reps = int(re.search(r"--reps (\d+)", command).group(1))
    for size in ("64 KiB", "1 MiB"):
        row = next(line for line in stdout.splitlines() if line.strip().startswith(f"{size}:"))
        assert len(re.findall(r"\d+", row.split(":", 1)[1].split("(")[0])) == reps
    share = re.search(r"receiving switch: ([\d.]+)% of the (\d+) MB", stdout)
    assert share and 0 < float(share.group(1)) <= 100 and int(share.group(2)) > 0


@pytest.mark.slow
@pytest.mark.parametrize("command", [c for c in _printed_commands() if "--vs-tunnels" in c])
def test_relay_against_stunnel_and_socat_prints_its_table(command):
    stdout = run_printed(command)
    lines = stdout.splitlines()
    for size in ("16 KiB", "64 KiB", "1 MiB", "16 MiB"):
        row = next(line for line in lines if line.strip().startswith(size))
        assert all(float(x) > 0 for x in row.split()[2:])  # every path measured at every size
    assert any(line.startswith("added latency per relay hop, p50 at 64 KiB") for line in lines)
    assert "load average" in stdout
