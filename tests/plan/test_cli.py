"""`nebula plan` end to end as a subprocess: a job sized from its checkpoint's config.json, a measured table written
with the benchmark's `write_rows`, the recommendation on a fast and a slow link, and the one-line errors."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from nebula.plan.sizing import config_params
from testbed.procs import BIN
from tests.plan._table import write_table

# a Llama of the table's width (hidden 128) with config_params(LLAMA) parameters, sized without weights
LLAMA = {"model_type": "llama", "vocab_size": 2000, "hidden_size": 128, "num_hidden_layers": 4,
         "intermediate_size": 344, "num_attention_heads": 4, "num_key_value_heads": 4}


def _job(tmp: Path, *, recipe: str = "nebula.formers:CausalLMRecipe", clusters: bool = True) -> Path:
    ckpt = tmp / "ckpt"
    ckpt.mkdir(exist_ok=True)
    (ckpt / "config.json").write_text(json.dumps(LLAMA), encoding="utf-8")
    doc = {"job": "llm", "recipe": {"factory": recipe, "args": {"from_pretrained": "ckpt", "data": "train.txt",
                                                                  "seq_len": 64}},
           "stages": [{"name": "embed", "cluster": "A"}, {"name": "head", "cluster": "B"}],
           "train": {"steps": 10, "global_batch": 8, "micro_batches": 2}}
    if clusters:
        doc["clusters"] = [{"id": "A"}, {"id": "B"}]
    path = tmp / ("job.yaml" if clusters else "no-clusters.yaml")
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


def _plan(procs, tmp: Path, *args: str) -> tuple[int, str, str]:
    p = procs.start([str(BIN / "nebula"), "plan", *args], cwd=str(tmp), stdout=-1, stderr=-1)
    out, err = p.communicate(timeout=120)
    return p.returncode, out, err


def _recommended(out: str) -> str:
    line = out.strip().splitlines()[-1]
    assert line.startswith("recommendation: "), out
    return line.removeprefix("recommendation: ").split(" -- ")[0]


def test_the_pick_moves_from_all_reduce_on_a_fast_link_to_diloco_on_a_slow_one(procs, tmp_path):
    job = _job(tmp_path)
    write_table(tmp_path / "t.json", params=config_params(LLAMA))  # the job is the table's model: scale 1
    rc, fast, err = _plan(procs, tmp_path, "job.yaml", "--link", "10gbit,1ms", "--table", "t.json")
    assert rc == 0, err
    assert _recommended(fast) == "all-reduce none"
    assert "ties within 1%" in fast.splitlines()[-1]
    rc, slow, err = _plan(procs, tmp_path, str(job), "--link", "10mbit,50ms", "--table", "t.json")
    assert rc == 0, err
    assert _recommended(slow) == "diloco H=100 int8"
    lines = slow.splitlines()
    assert lines[0] == "nebula plan: job llm (%s, 2 clusters) on a 10 Mbit/s, 50 ms RTT link" % job
    assert f"{config_params(LLAMA) / 1e6:.3g}M parameters, hidden 128, 8 x 64 = 512 tokens per step" in lines[1]
    rows = {ln[2:].split("  ")[0]: ln for ln in lines if ln[:1] in " *" and "  " in ln[2:] and "%" in ln}
    assert len(rows) == 7 and rows["diloco H=100 int8"].startswith("*")
    # all-reduce on 10 Mbit/s: 1 s of compute + 4 bytes per parameter each way at 1.25 MB/s + 25 ms
    expect = 1.0 + 4 * config_params(LLAMA) * 8 / 1e7 + 0.025
    assert rows["all-reduce none"].split()[2] == f"{expect:.3g}"
    footer = next(ln for ln in lines if ln.startswith("quality cost:"))
    assert "measured by benchmarks/wan_quality.py in t.json" in footer and "512k tokens per row" in footer
    assert "2 seeds differ by 0.50%" in footer and "not predicted for this job" in footer
    assert any(ln.startswith("step compute: the table's measured compute per token x job/table parameters (x1)")
               for ln in lines)


def test_a_larger_job_and_the_users_compute_change_the_prediction(procs, tmp_path):
    _job(tmp_path)
    write_table(tmp_path / "t.json", params=config_params(LLAMA) // 4)  # the job is 4x the table's model
    rc, out, err = _plan(procs, tmp_path, "job.yaml", "--link", "100mbit,20ms", "--table", "t.json")
    assert rc == 0, err
    assert "job/table parameters (x4)" in out
    one = next(ln for ln in out.splitlines() if ln[2:].startswith("one-cluster"))
    assert one.split()[1] == "8"  # 2 s per step of the table's model, 4x the parameters
    rc, out, err = _plan(procs, tmp_path, "job.yaml", "--link", "100mbit,20ms", "--table", "t.json",
                         "--compute-s", "0.5", "--quality-tolerance", "0")
    assert rc == 0, err
    one = next(ln for ln in out.splitlines() if ln[2:].startswith("one-cluster"))
    assert one.split()[1] == "0.5" and "--compute-s 0.5 s" in out
    assert _recommended(out) == "pipeline none"  # within 0%: the modes that lose nothing


def test_a_recipe_it_cannot_size_falls_back_to_the_tables_model_in_one_line(procs, tmp_path):
    _job(tmp_path, recipe="recipes.toy:ToyRecipe")
    write_table(tmp_path / "t.json")
    rc, out, err = _plan(procs, tmp_path, "job.yaml", "--link", "10mbit,50ms", "--table", "t.json")
    assert rc == 0, err
    notes = [ln for ln in out.splitlines() if "cannot size recipe recipes.toy:ToyRecipe" in ln]
    assert len(notes) == 1 and "the table's own model, 1M parameters and 512 tokens per step" in notes[0]
    assert _recommended(out) == "diloco H=100 int8"


@pytest.mark.parametrize("args, says", [
    (["job.yaml", "--link", "100mbit,20", "--table", "t.json"], "'20' is neither a rate nor an RTT; write it as "
                                                                "RATE[,RTT], e.g. 100mbit,20ms"),
    (["job.yaml", "--link", "fast", "--table", "t.json"], "write it as RATE[,RTT]"),
    (["job.yaml", "--link", "100mbit,20ms", "--table", "absent.json"], "no benchmark table at absent.json; measure "
                                                                       "one with `python benchmarks/wan_quality.py"),
    (["no-clusters.yaml", "--link", "100mbit,20ms", "--table", "t.json"], "no-clusters.yaml lists no clusters; add "
                                                                          "the clusters the job spans"),
    (["job.yaml", "--link", "100mbit,20ms", "--table", "t.json", "--quality-tolerance", "-0.1"], "must be >= 0"),
    (["job.yaml", "--link", "100mbit,20ms", "--table", "t.json", "--compute-s", "0"], "must be > 0 seconds"),
])
def test_bad_input_is_one_line_naming_the_problem_and_the_fix_exit_2(procs, tmp_path, args, says):
    _job(tmp_path)
    _job(tmp_path, clusters=False)
    write_table(tmp_path / "t.json")
    rc, out, err = _plan(procs, tmp_path, *args)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("nebula plan: ") and says in err, err


def test_every_option_has_help(procs, tmp_path):
    rc, out, _ = _plan(procs, tmp_path, "--help")
    assert rc == 0
    for opt in ("JOB", "--link RATE,RTT", "--table ROWS.json", "--quality-tolerance FRACTION", "--compute-s S"):
        assert opt in out
    assert "100mbit,20ms" in out and "wan_quality.py --json" in out and "2%" in out
