"""The README's relay comparison runs as printed and prints its table (figures are the benchmark's, not asserted)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_relay_against_stunnel_and_socat_prints_its_table():
    out = subprocess.run([sys.executable, "benchmarks/relay.py", "--vs-tunnels", "--reps", "3"], cwd=REPO, capture_output=True,
                         text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    for size in ("16 KiB", "64 KiB", "1 MiB", "16 MiB"):
        row = next(line for line in lines if line.strip().startswith(size))
        assert all(float(x) > 0 for x in row.split()[2:])  # every path measured at every size
    assert any(line.startswith("added latency per relay hop, p50 at 64 KiB") for line in lines)
    assert "load average" in out.stdout
