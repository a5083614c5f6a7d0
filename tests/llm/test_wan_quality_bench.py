"""README "Quality per WAN byte": the benchmark's quick command runs as printed and writes a row for every mode, with
the byte ordering its codecs and intervals promise (figures themselves are the benchmark's, not asserted)."""
from __future__ import annotations

import json
import re

import pytest

from tests.conftest import REPO
from tests.harness.readme import printed_commands, readme_tier, run_printed
from tests.llm.conftest import NEEDS_FORMERS

ALL = printed_commands("## Quality per WAN byte", "\n## ", ".venv/bin/python benchmarks/wan_quality.py")
QUICK = [c for c in ALL if "--quick" in c and "--rows" not in c]  # (the deltas' --rows command: the smallest tier's)
REAL = [c for c in ALL if "--real" in c]
PRINTED = QUICK + REAL  # the full table (~2 h) and --scale (hours) are PENDING in tests/test_readme_commands.py


@NEEDS_FORMERS
@pytest.mark.slow
@pytest.mark.parametrize("command", readme_tier(QUICK, QUICK))
def test_the_quick_table_runs_as_printed_with_every_mode(command):
    stdout = run_printed(command, timeout_s=1800)
    out = REPO / command.split("--json ")[1].split()[0]
    rows = {r["name"] + ("" if r["seed"] == 1 else f" seed {r['seed']}"): r for r in json.loads(out.read_text())}
    assert {r["mode"] for r in rows.values()} == {"one-cluster", "all-reduce", "pipeline", "diloco", "streaming-diloco",
                                                  "federated"}
    for r in rows.values():
        assert {"mode", "codec", "sync_every", "heldout_loss", "wan_bytes", "wall_s"} <= set(r)
        assert r["steps"] == rows["one-cluster"]["steps"] and r["tokens"] == rows["one-cluster"]["tokens"]
        assert 0 < r["heldout_loss"] < 20
    assert rows["one-cluster"]["wan_bytes"] == 0
    assert rows["all-reduce none"]["wan_bytes"] > rows["pipeline none"]["wan_bytes"] > \
        rows["pipeline int8"]["wan_bytes"]
    assert rows["pipeline none stale 1"]["wan_bytes"] == rows["pipeline none"]["wan_bytes"]
    assert rows["diloco H=10 none"]["wan_bytes"] * 9 < rows["all-reduce none"]["wan_bytes"]
    assert rows["diloco H=50 int4_block"]["wan_bytes"] * 4 < rows["diloco H=50 none"]["wan_bytes"]
    stream = rows["streaming-diloco H=50 F=4 tau=1 none"]  # a quarter of the model at a time
    assert stream["peak_wan_bytes"] * 3.5 < rows["diloco H=50 none"]["peak_wan_bytes"]
    delta = rows["pipeline delta(huffman(int3_block), first=huffman(int4_block), cache_mb=160) grad huffman(int4_block) "
                 "4 epochs"]
    assert delta["wan_bytes"] * 6 < rows["pipeline none 4 epochs"]["wan_bytes"]  # 3-bit deltas on examples seen again
    assert delta["wan_bytes"] < rows["pipeline huffman(int4_block) 4 epochs"]["wan_bytes"]  # and below 4-bit codes
    assert delta["extra"]["cache_bytes"] > 0 and "Activation deltas against the uncompressed pipeline" in stdout
    assert "one-cluster seed 2" in rows and "Baseline noise" in stdout
    assert "| one-cluster |" in stdout and (REPO / "runs" / "wan_quality" / "wan_quality.png").is_file()


@NEEDS_FORMERS
@pytest.mark.slow
@pytest.mark.parametrize("command", REAL)
def test_rows_through_real_switches_agree_with_the_one_process_rows(command):
    stdout = run_printed(command, timeout_s=2400)
    agree = re.findall(r"^\| (diloco H=10 int8|pipeline int8) \| ([\d.]+) \| ([\d.]+) \| ([\d,]+) \| ([\d,]+) ",
                       stdout, re.M)
    assert {a[0] for a in agree} == {"diloco H=10 int8", "pipeline int8"}, stdout[-3000:]
    for _, sim_loss, real_loss, sim_bytes, real_bytes in agree:
        assert abs(float(sim_loss) - float(real_loss)) < 1e-3  # the same computation, float order aside
        sim_b, real_b = (int(x.replace(",", "")) for x in (sim_bytes, real_bytes))
        assert sim_b <= real_b < sim_b * 1.02  # the runtime adds its messages' headers
    walls = re.findall(r"^\| (diloco H=10 int8|pipeline int8) \| (\d+) Mbit/s, 20 ms RTT \| ([\d.]+) \| ([\d.]+) \| ",
                       stdout, re.M)
    assert {(w[0], w[1]) for w in walls} == {(r, m) for r in ("diloco H=10 int8", "pipeline int8")
                                             for m in ("10", "100")}, stdout[-3000:]
    assert all(float(m) > 0 and float(p) > 0 for _, _, m, p in walls)
