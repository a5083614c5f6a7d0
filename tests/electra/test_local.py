"""The ELECTRA recipe inside one process (both generators and the discriminator, hand-off local): it learns, and a
hot start from its checkpoint continues exactly where it was."""
from __future__ import annotations

import json

import numpy as np
import pytest

from nebula.config.job import load_job_config
from nebula.pipeline import read_metrics, replace_steps
from nebula.modes import run
from tests.electra.helpers import GEN_STAGES, local_job

STEPS = 40


def test_local_run_learns_and_reports_per_language_accuracy(corpus, tmp_path):
    cfg = load_job_config(local_job(tmp_path, str(corpus), STEPS))
    res = run(cfg, "L", workdir=tmp_path)
    recs = read_metrics(tmp_path / "metrics" / "L.rank0.jsonl")
    assert [r["step"] for r in recs] == list(range(STEPS))
    first, last = np.mean([r["loss"] for r in recs[:5]]), np.mean([r["loss"] for r in recs[-5:]])
    assert last < 0.7 * first, (first, last)  # discriminator: 50 RTD + CLM
    assert recs[-1]["clm_loss"] < recs[0]["clm_loss"] and recs[-1]["rtd_loss"] < recs[0]["rtd_loss"]
    for g in GEN_STAGES:
        assert np.mean([r[f"loss/{g}"] for r in recs[-5:]]) < np.mean([r[f"loss/{g}"] for r in recs[:5]])
    def acc(rows, what, lang):
        n = sum(r.get(f"n/{lang}", 0) for r in rows)
        assert n > 0, lang  # every language, and the TRTD pairs, reached the discriminator
        return sum(r.get(f"{what}_ok/{lang}", 0) for r in rows) / n

    for lang in ("en", "es", "it", "ru", "ja", "en-es", "en-ja"):
        assert acc(recs[-10:], "clm", lang) > acc(recs[:10], "clm", lang), lang
        assert acc(recs[-10:], "rtd", lang) > 0.7, lang  # most tokens are original; RTD learned at least that
    assert res.losses[STEPS - 1] == recs[-1]["loss"]


def test_hot_start_continues_the_intra_cluster_loss_exactly(corpus, tmp_path):
    a = tmp_path / "intra"
    cfg = load_job_config(local_job(a, str(corpus), 12, checkpoint={"dir": "ckpt", "every": 6, "keep": 5}))
    ref = run(cfg, "L", workdir=a).losses
    b = tmp_path / "resumed"
    init = a / "ckpt" / "step_00000006"
    assert json.loads((init / "L.json").read_text())["step"] == 6
    cfg2 = load_job_config(local_job(b, str(corpus), 12, checkpoint={"init_from": str(init)}))
    got = run(replace_steps(cfg2, 12), "L", workdir=b)
    assert got.start_step == 6
    for s in range(6, 12):
        assert got.losses[s] == pytest.approx(ref[s], rel=1e-5), (s, got.losses[s], ref[s])


def test_discriminator_exports_as_an_abnet_base(corpus, tmp_path):
    from recipes.abnet.model import preset as abnet_preset
    from recipes.abnet.pretrain import load_base
    from recipes.electra.prepare import export_base

    cfg = load_job_config(local_job(tmp_path, str(corpus), 2, checkpoint={"dir": "ckpt"}))
    run(cfg, "L", workdir=tmp_path)
    step = tmp_path / "ckpt" / "step_00000002"
    base = export_base(step, corpus, tmp_path / "base", "tiny")
    model, tok = load_base(base, abnet_preset("tiny").source)  # ABNet's own loader, shape-checked
    assert tok.vocab_size == model.cfg.vocab_size and model.cfg.num_layers == 2
    with pytest.raises(ValueError, match="is not a 'small' discriminator.*pass the preset it was trained with"):
        export_base(step, corpus, tmp_path / "base2", "small")
