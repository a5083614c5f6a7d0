"""The README's trust benchmark runs as printed: every attack of an insider (a forged, bombed, replayed or rolled-back
peers update, an altered kit, a rewritten audit tail, an initial model from a cluster without the job grant, an
unclipped update under central DP, metrics read off loopback, a replayed SecAgg+ round, a combiner substituting
keys, clients dealing a bad share, forcing their weight or sending out-of-range words) has its row, and each row
reads refused, audited in the real audit log, and legitimate use intact. A fast test runs one row through `--only`
and `--json`."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.harness.readme import REPO, printed_commands, run_printed

PRINTED = printed_commands("What an attacker inside the federation gets", "\n## ",
                           ".venv/bin/python benchmarks/trust.py")
ATTACKS = ["forged-update", "yaml-bomb", "replayed-update", "rolled-back-crl", "altered-kit", "audit-rewrite",
           "initial-grant", "dp-clip", "metrics", "secagg-replay", "secagg-keys", "secagg-bad-share", "secagg-weight",
           "secagg-words"]


def table(stdout: str) -> list[dict[str, str]]:
    """The rows of the benchmark's table, cut at its header's columns."""
    lines = stdout.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("row ") and "refused" in line)
    cols = ["row", "attack", "refused", "audited", "intact", "detail"]
    at = [lines[head].index(c) for c in cols] + [None]
    return [{c: line[at[i]:at[i + 1]].strip() for i, c in enumerate(cols)} for line in lines[head + 1:] if line]


@pytest.mark.slow
@pytest.mark.readme
@pytest.mark.parametrize("command", PRINTED)
def test_every_attack_is_refused_audited_and_leaves_legitimate_use_intact(command):
    rows = table(run_printed(command, timeout_s=900))
    assert [r["row"] for r in rows] == ATTACKS, rows
    for r in rows:
        assert (r["refused"], r["intact"]) == ("yes", "yes") and r["audited"] != "-", r


def test_one_row_runs_alone_and_its_json_matches_the_table(tmp_path):
    out = subprocess.run([sys.executable, "benchmarks/trust.py", "--only", "altered-kit", "--json",
                          str(tmp_path / "rows.json")], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    (row,) = table(out.stdout)
    (js,) = json.loads((tmp_path / "rows.json").read_text())
    assert row["row"] == js["name"] == "altered-kit" and (js["refused"], js["intact"]) == (True, True), out.stdout
    assert js["audited"] == row["audited"] == "switch_start_failed" and "was altered" in js["detail"], js
    bad = subprocess.run([sys.executable, "benchmarks/trust.py", "--only", "nosuch"], cwd=REPO, capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2 and "--only nosuch: no such row" in bad.stderr
