"""Pipeline rows with activation deltas in the quality benchmark: each micro-batch's example ids key both ends'
caches, examples seen again go as 2-bit deltas, and the row is measured against the uncompressed pipeline on the
same data (the smaller training set its `epochs` asks for)."""
from __future__ import annotations

import json

import pytest

from tests.llm.conftest import NEEDS_FORMERS
from tests.llm.test_quality_engine import bench  # noqa: F401  (the engine tests' tiny Llama, a fixture)

pytestmark = NEEDS_FORMERS

DELTA = "delta(int2_block, first=int8_block)"


def _run(bench, **kw):
    from nebula.quality.engine import Budget
    from nebula.quality.rows import RowSpec

    return bench.run(RowSpec("pipeline", **kw), Budget(steps=8, global_batch=8, seq_len=24, lr=3e-3))


def test_delta_rows_send_deltas_on_examples_seen_again_and_stay_with_the_uncompressed_pipeline(bench, llama_dir):
    hidden = json.loads((llama_dir / "config.json").read_text())["hidden_size"]
    none = _run(bench, epochs=4)  # 8 steps x 8 sequences over 16 examples: each seen 4 times
    delta = _run(bench, codec=DELTA, grad_codec="int8", epochs=4)
    first_only = _run(bench, codec=DELTA, grad_codec="int8", epochs=1)  # 64 examples seen once: never a delta
    fwd, bwd = delta.extra["forward_bytes"], delta.extra["backward_bytes"]
    assert fwd + bwd == delta.wan_bytes and none.wan_bytes > 2 * none.tokens * hidden * 4  # float32 both ways
    assert fwd < 0.6 * first_only.extra["forward_bytes"]  # 3 of 4 sights as 2-bit deltas instead of 8-bit
    assert bwd == pytest.approx(first_only.extra["backward_bytes"], rel=0.01)  # gradients keep their codec
    assert delta.extra["cache_bytes"] == 16 * 24 * hidden * 4  # 16 examples per end, float32
    assert delta.heldout_loss == pytest.approx(none.heldout_loss, rel=0.02)
    assert delta.spec.name == "pipeline delta(int2_block, first=int8_block) grad int8 4 epochs"


def test_delta_rows_need_a_gradient_codec_and_the_pipeline():
    from nebula.quality.rows import RowSpec

    with pytest.raises(ValueError, match="set grad_codec"):
        RowSpec("pipeline", codec=DELTA)
    with pytest.raises(ValueError, match="gradients carry no example ids"):
        RowSpec("pipeline", codec="int8", grad_codec=DELTA)
    with pytest.raises(ValueError, match="apply to mode pipeline only"):
        RowSpec("diloco", codec=DELTA, sync_every=5)
    with pytest.raises(ValueError, match="epochs=-1 must be an integer >= 0"):
        RowSpec("pipeline", epochs=-1)


def test_plan_measures_a_delta_row_against_its_uncompressed_twin():
    from nebula.plan.table import _reference
    from nebula.quality.rows import RowResult, RowSpec

    def row(spec, loss):
        return RowResult(spec=spec, heldout_loss=loss, wan_bytes=1, wall_s=1, compute_s=1, steps=1, tokens=1,
                         params=1, seed=1)

    base = row(RowSpec("one-cluster"), 5.0)
    twin = row(RowSpec("pipeline", epochs=4), 6.0)
    delta = row(RowSpec("pipeline", codec=DELTA, grad_codec="int8", epochs=4), 6.06)

    class T:
        baseline, rows = base, (base, twin, delta)

    assert _reference(T, delta) is twin and _reference(T, twin) is twin and _reference(T, base) is base
