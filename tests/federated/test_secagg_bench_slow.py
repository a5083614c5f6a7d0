"""The federated recipe's secure aggregation benchmark runs as printed and prints its tables: the pure protocol's row
for every client count (SecAgg+'s neighbours and threshold, a client's bytes above a float32 update's), whole rounds
through a switch for plain FedAvg and secagg+ (the dropped clients counted, an update's bytes as the protocol sends
them: one 32-bit word per parameter, no count word; the round time as measured and with the clients' CPU off the
critical path), and DP-FedAvg's accuracy at every epsilon, each spending no more than its target. The small command
is CI's (readme tier), and so are the README's full-size ones as printed at their smallest size (NEBULA_SMOKE,
nebula/smoke.py); at their full size they are slow. Times are the benchmark's, not asserted."""
from __future__ import annotations

import re

import pytest

from tests.harness.readme import REPO, invocations, readme_tier, run_printed

PRINTED = sorted(c for c in invocations((REPO / "recipes" / "federated" / "README.md").read_text(encoding="utf-8"))
                 if "benchmarks/secagg.py" in c)
SMALL = [c for c in PRINTED if "--params 10000 " in c]  # CI's: every part at a small size


def _arg(command: str, name: str, default: str) -> list[str]:
    m = re.search(rf"(?<![\w-])--{name} ((?:[^-\s]\S*\s*)+)", command)
    return (m.group(1) if m else default).split()


def _rows(table: str) -> list[list[str]]:
    """The cells of the rows of the first markdown table in `table` (below its `| ---` line)."""
    lines = table.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("| ---"))
    rows = []
    for line in lines[at + 1:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def _part(stdout: str, heading: str) -> str:
    at = stdout.index(heading)
    end = stdout.find("\n## ", at + 1)
    return stdout[at:] if end < 0 else stdout[at:end]


@pytest.mark.slow
@pytest.mark.timeout(7200)
@pytest.mark.parametrize("command", readme_tier(PRINTED, SMALL))
def test_the_secagg_benchmark_runs_as_printed_and_prints_every_part(command):
    assert len(SMALL) == 1 and len(PRINTED) >= 4, PRINTED  # CI's command and the README's tables' commands
    _check(command, run_printed(command, timeout_s=7200))


@pytest.mark.slow
@pytest.mark.readme
@pytest.mark.timeout(600)
@pytest.mark.parametrize("command", [c for c in PRINTED if c not in SMALL])
def test_the_full_size_tables_run_as_printed_at_their_smallest_size(command):
    """CI's run of each full-size table's command as printed, at its smallest size (NEBULA_SMOKE: the small
    command's sizes): every part, row and column of the full one."""
    _check(command, run_printed(command, timeout_s=570, smallest=True), smallest=True)


def _check(command: str, stdout: str, smallest: bool = False) -> None:
    """Every part `command` asks for, a row for each client count and epsilon it gives; `smallest`: the client
    counts and the parameters as run (capped, nebula/smoke.py) are at most those printed."""
    only = _arg(command, "only", "pure,switch")[0].split(",")
    clients = [int(n) for n in _arg(command, "clients", "100 500")]
    params = int(_arg(command, "params", "1000000")[0])
    dropout = float(_arg(command, "dropout", "0.1")[0])
    if smallest and ("pure" in only or "switch" in only):
        ran = int(re.search(r"([\d,]+)[ -]param", stdout).group(1).replace(",", ""))
        assert 0 < ran <= min(params, 10_000), (ran, params)
        params = ran
    if "pure" in only:
        rows = _rows(_part(stdout, "## SecAgg+ protocol compute"))
        _same_counts([int(r[0]) for r in rows], clients, smallest, stdout)
        for n, k, t, *_, up_x in rows:
            assert 0 < int(t) <= int(k) <= int(n) - 1, (n, k, t)  # threshold within the neighbours
            assert float(up_x) >= 1.0  # the masked 32-bit words and the signed weight, at least a float32 update
    if "switch" in only:
        rows = _rows(_part(stdout, "## Rounds through a switch server"))
        ran = [int(r[0]) for r in rows][::2]
        _same_counts(ran, clients, smallest, stdout)
        assert [(int(r[0]), r[1]) for r in rows] == [(n, p) for n in ran for p in ("plain", "secagg+")], stdout
        for n, protocol, round_s, _, off_s, _, _, dropped, update, up, down, *_ in rows:
            assert float(round_s) > 0 and int(dropped) == round(dropout * int(n)), (n, protocol, dropped)
            assert 0 < float(off_s)  # the clients' CPU replaced by one client's: a time still, whatever the load
            assert float(update) == 4 * params, (n, protocol, update)  # 32-bit words, no count word
            assert (float(up) > 0 and float(down) > 0) == (protocol == "secagg+"), (n, protocol, up, down)
    if "accuracy" in only:
        part = _part(stdout, "## DP-FedAvg on the recipe's task")
        epsilons = [float(e) for e in _arg(command, "epsilons", "0,8,4,1")[0].split(",")]
        rows = [r for r in _rows(part) if not r[0].startswith("central")]
        assert len(rows) == len(epsilons) and "central baseline" in part, part
        for (eps, _, spent, *_rest), target in zip(rows, epsilons):
            assert (eps == "no DP") == (target == 0), (eps, target)
            if target:
                assert 0 < float(spent) <= target, (eps, spent)  # the noise spends no more than its target
            assert all(0 <= float(a) <= 1 for a in _rest[-3:]), _rest


def _same_counts(ran: list[int], printed: list[int], smallest: bool, stdout: str) -> None:
    """A row for each client count printed: the count itself, or at the smallest size one no larger."""
    assert len(ran) == len(printed), stdout[-3000:]
    assert all(0 < r <= p for r, p in zip(ran, printed)) if smallest else ran == printed, (ran, printed)
