"""The plan's arithmetic on a hand-computed table, and sizing a job's model from its checkpoint without building it."""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import struct

import pytest

from nebula.plan.link import WanLink
from nebula.plan.sizing import JobSize, config_params, safetensors_params
from nebula.plan.table import load_table, make_plan, table_hidden
from nebula.quality.rows import RowSpec, write_rows
from tests.plan._table import ACT, HIDDEN, PARAMS, rows, write_table

HAVE_FORMERS = importlib.util.find_spec("paddleformers") is not None


def _by_name(plan):
    return {r.name: r for r in plan.rows}


def test_on_the_tables_own_model_each_mode_is_its_compute_plus_its_link_time(tmp_path):
    table = load_table(write_table(tmp_path / "t.json"))
    assert table.baseline.heldout_loss == pytest.approx(4.01)  # two seeds averaged
    assert table.baseline_spread == pytest.approx(0.02 / 4.01)
    plan = make_plan(table, WanLink(100.0, 20.0), None)
    got = _by_name(plan)
    assert got["one-cluster"].step_s == pytest.approx(2.0) and got["one-cluster"].wan_bytes == 0
    assert got["all-reduce none"].step_s == pytest.approx(1.0 + 4e6 * 8 / 1e8 + 0.01)
    assert got["all-reduce none"].wan_bytes == pytest.approx(8e6)
    assert got["pipeline none"].step_s == pytest.approx(1.1 + ACT * 8 / 1e8 + 0.02)
    assert got["pipeline int8 stale 1"].step_s == pytest.approx(1.1)  # its link time hides behind compute
    assert got["diloco H=10 none"].step_s == pytest.approx(1.0 + 0.33 / 10)
    assert got["diloco H=100 int8"].step_s == pytest.approx(1.0 + (1e6 * 8 / 1e8 + 0.01) / 100)
    assert got["federated H=10 none"].step_s == pytest.approx(1.0 + (8e6 * 8 / 1e8 + 0.02) / 10)
    assert got["diloco H=100 int8"].quality_cost == pytest.approx(4.07 / 4.01 - 1)
    assert plan.recommended.name == "diloco H=100 int8" and plan.ties == ()


def test_a_bigger_job_scales_compute_by_parameters_and_tokens_and_bytes_by_what_each_mode_sends(tmp_path):
    table = load_table(write_table(tmp_path / "t.json"))
    assert table_hidden(table) == (HIDDEN, "the table's meta")
    job = JobSize(params=2 * PARAMS, hidden=2 * HIDDEN, seq_len=64, global_batch=16, source="test")
    got = _by_name(make_plan(table, WanLink(100.0, 20.0), job))
    # compute per token x 1024 tokens x 2 (parameters); the gradient doubles with the parameters
    assert got["one-cluster"].step_s == pytest.approx(8.0)
    assert got["all-reduce none"].compute_s == pytest.approx(4.0)
    assert got["all-reduce none"].step_s == pytest.approx(4.0 + 8e6 * 8 / 1e8 + 0.01)
    # the activation at the cut: twice the tokens, twice the hidden size
    assert got["pipeline none"].wan_bytes == pytest.approx(2 * 4 * ACT)
    assert got["pipeline none"].step_s == pytest.approx(4.4 + 4 * ACT * 8 / 1e8 + 0.02)
    assert got["diloco H=100 int8"].wan_bytes == pytest.approx(2 * 2 * 1e6 / 100)  # int8 keeps its ratio


def test_the_users_step_compute_replaces_the_scaling_and_keeps_each_modes_parallelism(tmp_path):
    table = load_table(write_table(tmp_path / "t.json"))
    got = _by_name(make_plan(table, WanLink(1000.0, 0.0), None, compute_s=3.0))
    assert got["one-cluster"].step_s == pytest.approx(3.0)
    assert got["all-reduce none"].compute_s == pytest.approx(1.5)
    assert got["pipeline none"].compute_s == pytest.approx(1.65)


def test_a_fast_link_ties_and_picks_the_exact_mode_a_slow_one_picks_diloco(tmp_path):
    table = load_table(write_table(tmp_path / "t.json"))
    fast = make_plan(table, WanLink(10_000.0, 1.0), None)
    assert fast.recommended.name == "all-reduce none"  # 0.4% slower than DiLoCo: a tie, and it loses nothing
    assert {t.name for t in fast.ties} >= {"diloco H=100 int8", "diloco H=10 none"}
    slow = make_plan(table, WanLink(10.0, 50.0), None)
    assert slow.recommended.name == "diloco H=100 int8" and slow.ties == ()
    strict = make_plan(table, WanLink(10.0, 50.0), None, tolerance=0.0)
    assert strict.recommended.name == "pipeline none"  # the fastest that loses nothing against the baseline
    with pytest.raises(ValueError, match="must be >= 0"):
        make_plan(table, WanLink(10.0, 50.0), None, tolerance=-0.1)


def test_when_every_mode_loses_quality_the_plan_stays_in_one_cluster(tmp_path):
    worse = [r if r.spec.mode == "one-cluster" else dataclasses.replace(r, heldout_loss=5.0) for r in rows()]
    worse.append(dataclasses.replace(worse[3], spec=RowSpec("all-reduce", codec="int4"), heldout_loss=math.nan))
    path = tmp_path / "t.json"
    write_rows(path, worse)  # no meta: the table's hidden size comes from the pipeline none row
    table = load_table(path)
    assert table_hidden(table)[0] == pytest.approx(HIDDEN)
    plan = make_plan(table, WanLink(10_000.0, 1.0), None)
    assert plan.recommended.name == "one-cluster"  # a diverged row (NaN loss) is never picked either
    path.write_text(path.read_text().replace("4.0,", "NaN,"), encoding="utf-8")
    with pytest.raises(ValueError, match="baseline's held-out loss is nan"):
        load_table(path)


def test_a_table_without_a_baseline_or_missing_is_refused_in_one_line(tmp_path):
    path = tmp_path / "t.json"
    write_rows(path, [r for r in rows() if r.spec.mode != "one-cluster"])
    with pytest.raises(ValueError, match="no one-cluster row") as exc:
        load_table(path)
    assert "\n" not in str(exc.value)
    with pytest.raises(ValueError, match="no benchmark table at .*wan_quality.py --json"):
        load_table(tmp_path / "absent.json")
    (tmp_path / "bad.json").write_text("{", encoding="utf-8")
    with pytest.raises(ValueError, match="cannot read benchmark rows"):
        load_table(tmp_path / "bad.json")


def test_parameters_from_config_sizes_count_every_projection_norm_and_head():
    cfg = {"vocab_size": 100, "hidden_size": 8, "num_hidden_layers": 2, "intermediate_size": 16,
           "num_attention_heads": 2, "num_key_value_heads": 1}
    layer = (8 * 8 + 2 * 8 * 4 + 8 * 8) + 3 * 8 * 16 + 2 * 8  # q, k, v (one KV head of 4), o; gated MLP; norms
    assert config_params(cfg) == 100 * 8 + 2 * layer + 8 + 100 * 8
    assert config_params({**cfg, "tie_word_embeddings": True}) == 100 * 8 + 2 * layer + 8
    assert config_params({**cfg, "attention_bias": True}) == config_params(cfg) + 2 * (8 + 2 * 4 + 8)
    with pytest.raises(ValueError, match="hidden_size"):
        config_params({**cfg, "hidden_size": 0})


def test_parameters_from_safetensors_headers_read_no_weights(tmp_path):
    header = {"a": {"dtype": "F32", "shape": [3, 4], "data_offsets": [0, 48]},
              "b": {"dtype": "F32", "shape": [5], "data_offsets": [48, 68]}, "__metadata__": {"format": "pt"}}
    raw = json.dumps(header).encode()
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw)  # data left out: not read
    assert safetensors_params(tmp_path) == 17
    assert safetensors_params(tmp_path / "nothing") is None
    (tmp_path / "junk.safetensors").write_bytes(b"\x01")
    assert safetensors_params(tmp_path) is None


@pytest.mark.skipif(not HAVE_FORMERS, reason="needs the formers extra (PaddleFormers): pip install -e '.[formers]'")
def test_a_saved_llamas_size_matches_the_built_models_parameters(tmp_path):
    import paddleformers.transformers as pft

    from nebula.quality.evaluate import num_params
    from recipes.llm.prepare import gettext_lines, save_tiny

    ckpt = save_tiny(tmp_path / "ckpt", gettext_lines(per_lang=20), vocab_size=300, hidden=32, intermediate=64,
                     layers=2)
    config = json.loads((ckpt / "config.json").read_text(encoding="utf-8"))
    built = num_params(pft.LlamaForCausalLM.from_pretrained(str(ckpt)))
    assert config_params(config) == safetensors_params(ckpt) == built


def test_a_malformed_safetensors_header_falls_back_to_no_count(tmp_path):
    import json as _json
    import struct as _struct

    from nebula.plan.sizing import safetensors_params

    for header in ({"w": {"dtype": "F32"}}, {"w": {"shape": ["x", 2]}}, {"w": 3}, [1, 2]):
        body = _json.dumps(header).encode()
        (tmp_path / "model.safetensors").write_bytes(_struct.pack("<Q", len(body)) + body)
        assert safetensors_params(tmp_path) is None, header
    body = _json.dumps({"w": {"dtype": "F32", "shape": [3, 4], "data_offsets": [0, 48]}}).encode()
    (tmp_path / "model.safetensors").write_bytes(_struct.pack("<Q", len(body)) + body)
    assert safetensors_params(tmp_path) == 12
