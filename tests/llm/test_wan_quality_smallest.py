"""README "Quality per WAN byte": the full table, the largest model, the rows files, their report, the extra rows, the
rows without outer momentum, a row added with another outer step, the Huffman-coded rows and the activation deltas run as printed, in the README's order, at their smallest size
(NEBULA_SMOKE: a tiny Llama for 20 steps; every row of each command still runs) in a view of the checkout with its
own runs/, so the rows measured at the full size are never overwritten. Each command prints the rows the README's
table beside it lists."""
from __future__ import annotations

import importlib.util
import json
import re
import sys

import pytest

from nebula.quality.rows import read_rows

from tests.conftest import REPO
from tests.harness.readme import printed_commands, run_printed, scratch_checkout
from tests.llm.conftest import NEEDS_FORMERS

_BENCH = ".venv/bin/python benchmarks/wan_quality.py"
_ALL = printed_commands("## Quality per WAN byte: which mode", "\n## ", _BENCH)


def _one(*words: str) -> str:
    found = [c for c in _ALL if all(w in c for w in words) and "--quick" not in c and "--real" not in c]
    assert len(found) == 1, (words, found)
    return found[0]


FULL = f"{_BENCH} --json runs/wan_quality/rows.json"  # the full table
SCALE = _one("--scale --from runs/wan_quality/rows.json")
ROWS = _one("--rows 'diloco H=100 int8,all-reduce", "rows.json")
ROWS2 = _one("--json runs/wan_quality/rows2.json")
REPORT = next(c for c in _ALL if c.endswith("--report runs/wan_quality/rows.json runs/wan_quality/rows2.json"))
EXTRA = _one("--json runs/wan_quality/extra.json")
M0 = _one("--outer-momentum 0", "rows-m0.json")
SWEEP = _one("--add-to runs/wan_quality/rows.json --outer-lr 1.0")
LOWBIT = _one("--json runs/wan_quality/lowbit.json")
DELTA_FULL = _one("--rows '4 epochs'", "--json runs/wan_quality/delta.json")
DELTA = next(c for c in _ALL if "--rows '4 epochs'" in c and "--quick" in c)  # (the deltas' table at the quick size)
ALL_FULL = _one("--json runs/wan_quality/all-full.json")  # the full-size tables' rows in one file
SCALE_RUN = _one("--scale --from runs/wan_quality/all-full.json")  # the largest model, as run here
SCALE_REPORT = _one("--report runs/wan_quality/scale.json")  # its rows so far
PRINTED = [FULL, SCALE, ROWS, ROWS2, REPORT, EXTRA, M0, SWEEP, ALL_FULL, SCALE_RUN, SCALE_REPORT, LOWBIT, DELTA,
           DELTA_FULL]
assert FULL in _ALL


def _bench_module():
    spec = importlib.util.spec_from_file_location("wan_quality_bench", REPO / "benchmarks" / "wan_quality.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


def best_of_each_mode(rows):
    """The benchmark's own choice of the rows --scale runs."""
    return _bench_module().best_of_each_mode(rows)


def _names(stdout: str) -> list[str]:
    """The first column of the full table (`| row | params | ...`) a command printed."""
    return re.findall(r"^\| ([^|]+?) \| [\d,]+ \| [\d,]+ \| [\d,]+ \| ", stdout, re.M)


def _readme_rows(command: str) -> list[str]:
    """The rows of the README's table printed after `command` (wrapped over lines in the prose)."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    pattern = r"\s+".join(map(re.escape, command.split()))
    for m in re.finditer(pattern, text):
        after = text[m.end():]
        table = after[after.index("\n| "):]
        table = table[:table.index("\n\n", 1)]
        if table.lstrip().startswith("| row |"):
            return _names(table.strip() + "\n")
    raise AssertionError(f"no `| row |` table after {command!r} in the README")


@NEEDS_FORMERS
@pytest.mark.slow
@pytest.mark.readme
@pytest.mark.timeout(3600)  # seven runs; a few minutes on a quiet machine
def test_every_printed_wan_quality_command_runs_at_its_smallest_size_in_the_readmes_order(tmp_path):
    view = scratch_checkout(tmp_path / "checkout")
    rows_file = view / "runs" / "wan_quality" / "rows.json"

    full = run_printed(FULL, smallest=True, cwd=view)
    rows = json.loads(rows_file.read_text())
    assert {r["mode"] for r in rows} == {"one-cluster", "all-reduce", "pipeline", "diloco", "streaming-diloco",
                                        "federated"}
    assert {r["codec"] for r in rows if r["mode"] == "pipeline" and not r["epochs"]} == {"none", "fp16", "int8",
                                                                                        "int4_block"}
    assert {r["name"] for r in rows if r["epochs"]} == {  # activation deltas beside their uncompressed twin
        "pipeline none 4 epochs", "pipeline huffman(int4_block) 4 epochs",
        "pipeline delta(huffman(int3_block), first=huffman(int4_block), cache_mb=160) grad huffman(int4_block) "
        "4 epochs"}
    assert {r["name"] for r in rows} >= {"diloco H=100 fp4", "diloco H=100 ef(topk2(0.05))",
                                         "diloco H=100 huffman(int4_block)"}
    assert "diloco H=100 huffman(int8)" not in {r["name"] for r in rows}  # (a variant: --rows runs it)
    assert len(_names(full)) == len(rows) == 29 and "Baseline noise" in full and "Best row of each mode" in full
    assert (view / "runs" / "wan_quality" / "wan_quality.png").is_file()
    assert not (REPO / "runs" / "wan_quality" / "corpus-200k").exists()  # (the view's runs/, not the checkout's)

    best = [s.name for s in best_of_each_mode(read_rows(rows_file))]
    bench = _bench_module()
    frontier = [s.name for s in bench.frontier_rows(bench.smallest(bench.SIZES["scale"])) if s.name not in best]
    # the baseline (two seeds), the best row of each mode and the frontier methods beside their references (the
    # deltas' cache sized for the smallest size's activations)
    scale = run_printed(SCALE, smallest=True, cwd=view)
    assert "cache_mb=32)" in frontier[-1] and _names(scale) == [*best, *frontier, "one-cluster (seed 2)"]

    for command in (ROWS, ROWS2):  # the two files the report reads, each the README's rows
        out = view / command.split("--json ")[1]
        run_printed(command, smallest=True, cwd=view)
        assert [r["name"] for r in json.loads(out.read_text())], out
    report = run_printed(REPORT, smallest=True, cwd=view)
    assert _names(report) == _readme_rows(REPORT) and "Best row of each mode" in report

    for command in (EXTRA, M0):
        stdout = run_printed(command, smallest=True, cwd=view)
        assert sorted(_names(stdout)) == sorted(_readme_rows(command)), stdout[-2000:]  # (the README's own order)
        assert (view / command.split("--json ")[1]).is_file()
    m0 = json.loads((view / "runs" / "wan_quality" / "rows-m0.json").read_text())
    assert m0[0]["meta"]["outer_momentum"] == 0.0

    sweep = run_printed(SWEEP, smallest=True, cwd=view)  # a row added to rows.json's, with its own outer step
    assert _names(sweep) == _readme_rows(SWEEP), sweep[-2000:]
    added = json.loads((view / SWEEP.split("--json ")[1]).read_text())
    assert [(r["meta"]["outer_lr"], r["meta"]["outer_momentum"]) for r in added if r["mode"] == "streaming-diloco"
            ] == [(1.0, 0.0)]

    run_printed(ALL_FULL, smallest=True, cwd=view)  # the rows files above in one, a later file's row winning
    merged = {r["name"]: r for r in json.loads((view / "runs" / "wan_quality" / "all-full.json").read_text())}
    assert merged["streaming-diloco H=100 F=4 tau=1 int4_block"]["meta"]["outer_momentum"] == 0.0  # (the sweep's)
    assert merged["diloco H=10 int8"]["meta"]["outer_momentum"] == 0.0  # (rows-m0's)
    picked = [s.name for s in best_of_each_mode(read_rows(view / "runs" / "wan_quality" / "all-full.json"))]
    scale_run = run_printed(SCALE_RUN, smallest=True, cwd=view)
    every = [s.name for s in bench.frontier_rows(bench.smallest(bench.SIZES["scale"]))]
    assert sorted(_names(scale_run)) == sorted([*picked, *[n for n in every if n not in picked],
                                                "one-cluster (seed 2)"]), scale_run[-2000:]
    scale_report = run_printed(SCALE_REPORT, smallest=True, cwd=view)
    assert sorted(_names(scale_report)) == sorted(_names(scale_run)) and "Best row of each mode" in scale_report
    # the README lists the full-size run's rows finished so far: which row of a mode --scale picks depends on the
    # losses measured, so each is a row of the merged file, a frontier row or the second seed
    assert set(_readme_rows(SCALE_REPORT)) <= {*merged, *every, "one-cluster (seed 2)"}

    low = run_printed(LOWBIT, smallest=True, cwd=view)  # 4-bit outer gradients, Huffman-coded, beside int8
    assert _names(low) == _readme_rows(LOWBIT), low[-2000:]
    coded = {r["name"]: r for r in json.loads((view / LOWBIT.split("--json ")[1]).read_text())}
    assert coded["diloco H=100 huffman(int8)"]["heldout_loss"] == coded["diloco H=100 int8"]["heldout_loss"]  # lossless
    assert coded["diloco H=100 huffman(int8)"]["wan_bytes"] < coded["diloco H=100 int8"]["wan_bytes"]
    assert len({r["meta"]["data"] for r in coded.values()}) == 1  # one corpus and model, fingerprinted
    # stopped after some rows and finished with --resume (as the README's table was): the rows kept, the others
    # run, printed in the order the uninterrupted run prints them
    low_file = view / LOWBIT.split("--json ")[1]
    kept = [r for r in json.loads(low_file.read_text()) if r["name"] not in ("diloco H=100 int8", "diloco H=100 fp4")]
    low_file.write_text(json.dumps(kept))
    resumed = run_printed(LOWBIT + " --resume", smallest=True, cwd=view)
    assert f"{len(kept)} rows kept" in resumed and _names(resumed) == _names(low)
    again = {r["name"]: r for r in json.loads(low_file.read_text())}
    assert again["diloco H=100 huffman(int8)"] == coded["diloco H=100 huffman(int8)"]  # kept as it was
    assert again["diloco H=100 int8"]["heldout_loss"] == coded["diloco H=100 int8"]["heldout_loss"]  # run again
    runs_before = json.loads(low_file.read_text())
    runs_before[1]["meta"]["data"] = "0" * 16  # a row of another corpus or model: refused, not compared
    low_file.write_text(json.dumps(runs_before))
    with pytest.raises(AssertionError, match="run the rows again into a new file"):
        run_printed(LOWBIT + " --resume", smallest=True, cwd=view)

    for command in (DELTA, DELTA_FULL):  # the deltas beside their twin, and their own table
        delta = run_printed(command, smallest=True, cwd=view)
        assert _names(delta) == _readme_rows(command), delta[-2000:]
        assert "Activation deltas against the uncompressed pipeline on the same data:" in delta
        assert re.search(r"^\| pipeline delta\(int2_block, first=int4_block\) grad int4_block 4 epochs \| [\d.]+ \| "
                         r"[-+][\d.]+% \| [\d,]+ \| [\d.]+ \| [\d.]+ MiB \|$", delta, re.M), delta[-2000:]
