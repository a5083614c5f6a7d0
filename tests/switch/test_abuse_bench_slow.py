"""The README's abuse benchmark runs as printed: every flood is measured, none grows the switches past their memory
cap, and after the incarnation poison a peer's real message still gets through (throughputs are the benchmark's,
not asserted)."""
from __future__ import annotations

import re

import pytest

from tests.harness.readme import printed_commands, run_printed

PRINTED = printed_commands("`benchmarks/abuse.py` measures", "\n## ", ".venv/bin/python benchmarks/abuse.py")
_ROW = re.compile(r"^(.+?)\s+(A->B|B->A)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(ok|MISSED)$")


@pytest.mark.slow
@pytest.mark.readme
@pytest.mark.parametrize("command", PRINTED)
def test_every_flood_stays_within_the_memory_cap_and_the_poisoned_peer_is_heard_again(command):
    stdout = run_printed(command)
    rows = [m.groups() for m in map(_ROW.match, stdout.splitlines()) if m]
    floods = {r[0].strip() for r in rows}
    for name in ("credit ignored", "PING flood", "CHECKPOINT flood", "connections without LINK_HELLO",
                 "ACK bomb", "incarnation poison", "BYE flood", "account floods a peer's unconnected ranks"):
        assert any(f.startswith(name) or name in f for f in floods), (name, floods)
    for name, _, growth_mib, of_cap, rate, _, _ in rows:
        assert float(of_cap) <= 1.0, (name, growth_mib)  # the switches' growth within link.memory_cap_bytes
        assert float(rate) > 0, name  # the legitimate probe moved while the flood ran
    assert "C's next message with a real incarnation reached A: yes" in stdout
