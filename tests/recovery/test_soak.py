"""The README's soaks run as printed (the 20-minute one and the short one): two-cluster pipeline and three-cluster
one-way training through the fault harness (a cluster killed and relaunched by its supervisor, a switch restart, and
as root: packet loss and link cuts in namespaces), and federated rounds with churn. Nothing lost or duplicated,
losses equal to the fault-free twin's, no update averaged twice. Without root the namespace faults are left out,
and the table says so. (Speeds and times are the benchmark's, not asserted.)"""
from __future__ import annotations

import os
import re

import pytest

from tests.harness.readme import printed_commands, run_printed

PRINTED = printed_commands("## Surviving a cluster's loss", "\n## ", ".venv/bin/python benchmarks/soak.py")


def _limit_s(command: str) -> int:
    """Time for a soak: the short ones within the suite's 10 minutes, the full one (20 + 5 minutes of training,
    each beside its fault-free twin, then federated rounds) within the hour."""
    return 600 if "--minutes" in command else 3600


@pytest.mark.slow
@pytest.mark.parametrize("command", [pytest.param(c, marks=[pytest.mark.timeout(_limit_s(c)),  # (CI: the short one)
                                                        *([pytest.mark.readme] if "--minutes" in c else [])])
                                     for c in PRINTED])
def test_the_soak_loses_nothing_and_matches_the_fault_free_losses(command):
    text = run_printed(command, timeout_s=_limit_s(command) - 30)
    assert "load average" in text
    for mode in ("pipeline (2 clusters", "oneway3 (3 clusters"):
        block = text.split(mode, 1)[1].split("\n\n", 1)[0]
        assert re.search(r"lost / duplicated\s+0 / 0 of [1-9]", block), block
        assert re.search(r"steps that differ: 0 of [1-9]", block), block
        assert re.search(r"recoveries / kill -> first step\s+1 / [0-9.]+ s", block), block
        assert "FAILED" not in block, block
        if os.geteuid() == 0:
            assert "cut A" in block, block  # the namespace faults ran
    if os.geteuid() != 0:
        assert "not root: no network namespaces, so packet loss and link cuts are left out" in text
    assert re.search(r"updates averaged twice\s+0\n", text), text
