"""The benchmarks the recipes' READMEs print run as printed at their smallest size (NEBULA_SMOKE, nebula/smoke.py:
every row, stage and table, on a tiny budget), each in a view of the checkout with its own runs/ so that no figure
measured at the full size is overwritten: ABNet's Table 5 (training, BLEU and Figure 10, the paper's shape), the
codec tables, ELECTRA's Scenario I, the federated tables, FedOptima's idle time and the DiLoCo rows. Each test checks
the table the command is for: its rows and columns, and the files it writes. Figures are the benchmarks', not
asserted."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from tests.harness.readme import REPO, invocations, run_printed, scratch_checkout

pytestmark = [pytest.mark.slow, pytest.mark.readme, pytest.mark.timeout(2400)]

_ABNET = REPO / "recipes" / "abnet" / "README.md"
_ELECTRA = REPO / "recipes" / "electra" / "README.md"
_FEDERATED = REPO / "recipes" / "federated" / "README.md"


def _printed(path: Path, *words: str) -> str:
    """The one command `path` prints (inline or in a ```bash block) that holds every word of `words`."""
    found = [c for c in invocations(path.read_text(encoding="utf-8")) if all(w in c for w in words)]
    assert len(found) == 1, (path.name, words, found)
    return found[0]


TABLE5 = _printed(_ABNET, "abnet_table5.py --steps 30")
TABLE5_BLEU = _printed(_ABNET, "abnet_table5.py --steps 2000", "--bleu")
TABLE5_PAPER = _printed(_ABNET, "abnet_table5.py --paper-shape")
CPU_PATHS = _printed(_ABNET, "compression.py --cpu-paths")
DEMO_SHAPES = _printed(_ABNET, "compression.py --demo-shapes")
ELECTRA = ["python benchmarks/electra.py", _printed(_ELECTRA, "benchmarks/electra.py --out")]
FED_CODEC = _printed(_FEDERATED, "federated.py --only codec")
FED_MEMORY = _printed(_FEDERATED, "federated.py --only memory")
FED_WAN = _printed(_FEDERATED, "federated.py --only wan")
FED_SCALE = _printed(_FEDERATED, "federated.py --only scale")
IDLE = _printed(_FEDERATED, "idle_time.py --skip-owl")
DILOCO = _printed(_FEDERATED, "benchmarks/diloco.py --steps 600")
PREPARE_LANGID = _printed(_FEDERATED, "prepare('langid.npz')")  # (the DiLoCo sequence's; run before DILOCO)
assert ELECTRA[0] in invocations(_ELECTRA.read_text(encoding="utf-8"))
PRINTED = [TABLE5, TABLE5_BLEU, TABLE5_PAPER, CPU_PATHS, DEMO_SHAPES, *ELECTRA, FED_CODEC, FED_MEMORY, FED_WAN,
           FED_SCALE, IDLE, DILOCO]

KEY_ROWS = ["baseline", "FP16+INT8", "FP16(SVD(0.6))+INT8", "FP16(SVD(0.2))+INT8"]


def _table(stdout: str, first: str) -> list[list[str]]:
    """The cells of the markdown table whose header starts `| first`, header and rule left out."""
    lines = stdout.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(f"| {first}"))
    rows = []
    for ln in lines[start + 2:]:
        if not ln.startswith("|"):
            break
        rows.append([c.strip() for c in ln.strip().strip("|").split("|")])
    return rows


def test_table5_training_bleu_figure10_and_paper_shape_run_as_printed_in_order(tmp_path):
    view = scratch_checkout(tmp_path / "checkout")
    work = view / "runs" / "table5"
    stdout = run_printed(TABLE5, smallest=True, cwd=view)
    rows = _table(stdout, "method")
    assert [r[0] for r in rows][:4] == KEY_ROWS and len(rows) == 5, stdout[-3000:]  # the key rows and the small pair
    assert rows[0][2] == "1.000" and float(rows[1][2]) < 1 and "1 seeds per row" in stdout  # fwd bytes vs baseline
    assert "| baseline |" in (work / "table5.md").read_text()

    stdout = run_printed(TABLE5_BLEU, smallest=True, cwd=view)  # the same data and bases, BLEU and Figure 10
    header = next(ln for ln in stdout.splitlines() if ln.startswith("| method"))
    assert "BLEU test" in header, header
    rows = _table(stdout, "method")
    assert [r[0] for r in rows][:4] == KEY_ROWS and rows[-1][0].startswith("FP16(SVD(0.6))+INT8 from step ")
    bleu = header.strip("|").split("|").index(" BLEU test (mean ± sd) ")
    assert all(0 <= float(r[bleu].split("±")[0]) <= 100 for r in rows)
    assert (work / "table5_losses.png").is_file()

    stdout = run_printed(TABLE5_PAPER, smallest=True, cwd=view)
    rows = _table(stdout, "method")
    assert [r[0] for r in rows][:4] == KEY_ROWS and all(float(r[6]) > 0 for r in rows)  # comm s
    assert (work / "table5_paper_shape.md").is_file()


@pytest.mark.parametrize("command", [CPU_PATHS, DEMO_SHAPES])
def test_the_codec_tables_run_as_printed(command, tmp_path):
    stdout = run_printed(command, smallest=True, cwd=scratch_checkout(tmp_path / "checkout"))
    rows = _table(stdout, "codec")
    if "--cpu-paths" in command:
        assert [r[0] for r in rows] == ["fp16", "int8", "fp16(svd(0.6))", "fp16(svd(0.2))", "int4_block(64)",
                                        "ef(int8(lowrank(rank=4)))"]
        assert all(float(r[1]) > 0 and float(r[2]) > 0 for r in rows)
    else:
        assert rows[0][0] == "none" and "int8_row(lowrank(rank=16))" in [r[0] for r in rows]
        ratio = {r[0]: float(r[-3]) for r in rows}  # the worst ratio over T
        assert ratio["int8"] < ratio["fp16"] < ratio["none"]


@pytest.mark.parametrize("command", ELECTRA)
def test_electra_scenario_one_runs_as_printed(command, tmp_path):
    view = scratch_checkout(tmp_path / "checkout")
    out = Path(command.split("--out ")[1]) if "--out" in command else None
    if out is not None:  # a fixed path the README prints: a run of before (its federation provisioned) goes first
        shutil.rmtree(out, ignore_errors=True)
    try:
        stdout = run_printed(command, smallest=True, cwd=view)
    finally:
        if out is not None:  # (the figure kept for the check below, the path left as it was found: absent)
            if (out / "figure8.png").is_file():
                shutil.copy2(out / "figure8.png", tmp_path / "figure8.png")
            shutil.rmtree(out, ignore_errors=True)
    assert re.search(r"^intra: local link \(unshaped\)\s+[\d.]+\s+[\d.]+\s+1\.000\s+\d+", stdout, re.M), stdout[-3000:]
    assert re.search(r"^inter: WAN 170 Mbit/s, 10 ms\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+[1-9]\d*$", stdout, re.M)
    sweep = re.findall(r"^\s+(\d)\s+(\d)\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+[\d.]+$", stdout, re.M)
    assert [k for k, _ in sweep] == ["1", "2"], stdout[-3000:]
    assert re.search(r"k auto with 2 discriminator ranks chose k=\d", stdout)
    png = tmp_path / "figure8.png" if out is not None else view / "runs" / "electra-bench" / "figure8.png"
    assert png.is_file()


def test_the_federated_tables_run_as_printed(tmp_path):
    view = scratch_checkout(tmp_path / "checkout")
    stdout = run_printed(FED_CODEC, smallest=True, cwd=view)
    rows = _table(stdout, "update_codec")
    assert [r[0] for r in rows] == ["none", "fp16", "ef(int8_block)", "topk(0.05)", "ef(topk(0.05))"]
    assert all(0 < float(a) <= 1 for r in rows for a in r[3:]) and len(rows[0]) == 3 + 2  # two rounds
    assert float(rows[1][1]) < float(rows[0][1])  # fp16 sends fewer bytes than float32

    stdout = run_printed(FED_MEMORY, smallest=True, cwd=view)
    (row,) = _table(stdout, "model MB")
    assert float(row[0]) > 0 and float(row[3]) >= float(row[2]) and "target: growth" in stdout

    stdout = run_printed(FED_WAN, smallest=True, cwd=view)
    rows = _table(stdout, "WAN-once")
    assert [r[0] for r in rows] == ["yes", "no"] and float(rows[1][3]) > float(rows[0][3])
    assert "ratio without / with WAN-once" in stdout

    stdout = run_printed(FED_SCALE, smallest=True, cwd=view)
    rows = _table(stdout, "clients")
    assert [int(r[0]) for r in rows] == [10, 20] and all(int(r[2]) == int(r[0]) for r in rows), stdout[-2000:]


def test_the_idle_time_benchmark_runs_as_printed_in_both_settings(tmp_path):
    stdout = run_printed(IDLE, smallest=True, cwd=scratch_checkout(tmp_path / "checkout"))
    sections = re.split(r"\n(?=## )", stdout)
    fedoptima = [s for s in sections if s.startswith("## FedOptima on Testbed")]
    assert [s.split(":")[0] for s in fedoptima] == ["## FedOptima on Testbed A", "## FedOptima on Testbed B"]
    assert not [s for s in sections if s.startswith("## OWL")]
    for part in fedoptima:
        speeds = re.split(r"\n(?=### server )", part)[1:]
        assert len(speeds) == 2, part[:500]  # the slowest and the fastest server
        for speed in speeds:
            for method in ("fedavg", "oafl", "fedoptima"):
                row = re.search(rf"^\| {method} \| .*? \| .*? \| (\d+) \|", speed, re.M)
                assert row and int(row.group(1)) > 0, (method, speed[:300])
    assert "server idle cut, best over settings" in stdout


def test_the_diloco_rows_run_as_printed_on_the_prepared_data(tmp_path):
    view = scratch_checkout(tmp_path / "checkout")
    run_printed(PREPARE_LANGID, cwd=view)  # the DiLoCo sequence's data: langid.npz where the command reads it
    assert (view / "langid.npz").is_file()
    stdout = run_printed(DILOCO, smallest=True, cwd=view)
    labels = ["sync every step", "average every 3", "DiLoCo every 3, lr 0.7 momentum 0",
              "DiLoCo every 3, lr 0.7 momentum 0.9", "DiLoCo every 3, int8", "DiLoCo every 3, fp16(lowrank(rank=4))"]
    rows = {label: line[len(label):].split() for line in stdout.splitlines() for label in labels
            if line.startswith(label) and re.match(r"\s+\d+\s", line[len(label):])}
    assert list(rows) == labels, stdout[-3000:]
    assert int(rows["sync every step"][0]) == 6 and all(int(r[0]) == 2 for k, r in rows.items() if "3" in k)
    assert float(rows["DiLoCo every 3, int8"][3]) < float(rows["DiLoCo every 3, lr 0.7 momentum 0"][3])  # WAN MB
    assert re.search(r"^plot: .*diloco\.png$", stdout, re.M)
