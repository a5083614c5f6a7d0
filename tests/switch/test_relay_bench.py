"""The README's relay comparisons run as printed and print their tables (figures are the benchmark's, not
asserted): every `benchmarks/relay.py --vs-tunnels` and `--sustained` command its speed section prints; and, fast,
one short comparison with every receiving end in a process of its own."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.harness.readme import REPO, printed_commands, run_printed

SIZES = ("16 KiB", "64 KiB", "1 MiB", "16 MiB")


def _printed_commands() -> list[str]:
    return printed_commands("**The switch path against a C tunnel.**", "**The pipeline against its ideal step.**",
                            ".venv/bin/python benchmarks/relay.py --")


PRINTED = _printed_commands()


@pytest.mark.slow
@pytest.mark.readme  # (seconds)
@pytest.mark.parametrize("command", [c for c in PRINTED if "--sustained" in c])
def test_sustained_streams_print_every_repetition_and_the_arena_share(command):
    stdout = run_printed(command)
    reps = int(re.search(r"--reps (\d+)", command).group(1))
    for size in ("64 KiB", "1 MiB"):
        row = next(line for line in stdout.splitlines() if line.strip().startswith(f"{size}:"))
        assert len(re.findall(r"\d+", row.split(":", 1)[1].split("(")[0])) == reps
    share = re.search(r"receiving switch: ([\d.]+)% of the (\d+) MB", stdout)
    assert share and 0 < float(share.group(1)) <= 100 and int(share.group(2)) > 0


@pytest.mark.slow
@pytest.mark.readme  # (seconds to a minute each)
@pytest.mark.parametrize("command", [c for c in PRINTED if "--vs-tunnels" in c])
def test_relay_against_stunnel_and_socat_prints_its_table(command):
    _assert_table(run_printed(command), "--receiver thread" not in command)


def test_every_receiving_end_in_a_process_of_its_own_is_measured_at_every_size():
    out = subprocess.run([sys.executable, "benchmarks/relay.py", "--vs-tunnels", "--reps", "1", "--budget-mib", "2"],
                         cwd=REPO, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    _assert_table(out.stdout, own_process=True, cpu=False)  # (streams this short may take under a clock tick)


def _assert_table(stdout: str, own_process: bool, cpu: bool = True) -> None:
    lines = stdout.splitlines()
    header = next(line for line in lines if line.split()[:2] == ["message", "nebula"])
    paths = sum(1 for word in header.split() if word == "MB/s")
    for size in SIZES:
        row = next(line for line in lines if line.strip().startswith(size)).split()[2:]
        assert all(float(x) > 0 for x in row[:paths + 1])  # every path measured at every size, and the ratio
        if cpu:
            assert all(float(x) > 0 for x in row[paths + 1:])
    hop = next(line for line in lines if line.startswith("added latency per relay hop, p50 at 64 KiB"))
    assert re.search(r"nebula (\d+\.\d+) ms", hop)
    assert "load average" in stdout
    assert ("the receiving end in a process of its own" in stdout) == own_process
    assert ("the receiving end a thread of the sending process" in stdout) != own_process
    if own_process:  # each relayed path's CPU by process: sender, relay A, relay B, receiver
        at = next(i for i, line in enumerate(lines) if line.startswith("CPU ms per MiB of each process"))
        relayed = lines[at + 1].count(": sender, A, B, receiver")
        assert relayed == paths - 1  # (every path but raw TLS)
        for line, size in zip(lines[at + 2:], SIZES):
            assert line.strip().startswith(size) and len(re.findall(r"\d+\.\d\d", line)) == 4 * relayed
