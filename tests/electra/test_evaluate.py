"""Downstream evaluation pieces: the balanced evaluation set, the linear probe, English fine-tuning of the domain
classifier, retrieval in every language, and the CLI's tables."""
from __future__ import annotations

import json

import numpy as np
import paddle
import pytest

from recipes.abnet.model import BertModel
from recipes.text.tokenizer import Tokenizer
from recipes.electra.data import read_meta
from recipes.electra.evaluate import (Embedder, build_eval_set, finetune_transfer, linear_probe, load_split, main,
                                      retrieval)
from recipes.electra.model import preset


def _held_out(corpus):
    return load_split(corpus, "test") + load_split(corpus, "dev")


def test_eval_set_is_balanced_per_language_and_never_uses_training_text(corpus):
    train = load_split(corpus, "train")
    ev = build_eval_set(train, _held_out(corpus), 2, max_pairs=5)
    assert sorted(ev.labels) == ["files", "images"]
    assert set(ev.test) == {"en", "es", "it", "ru", "ja"} and set(ev.pairs) == {"es", "it", "ru", "ja"}
    for items in list(ev.test.values()) + [ev.train_en]:
        counts = np.bincount([y for _, y in items], minlength=2)
        assert counts[0] == counts[1] > 0  # chance is 1/2 in every language
    seen = {r["en"] for r in train} | {r["text"] for r in train}
    assert not any(t in seen for items in ev.test.values() for t, _ in items)
    assert all(len(p) <= 5 for p in ev.pairs.values())
    with pytest.raises(ValueError, match="ask for fewer domains"):
        build_eval_set(train, _held_out(corpus), 3)


def test_linear_probe_separates_separable_features_and_keeps_every_key():
    rng = np.random.default_rng(0)
    y = np.repeat([0, 1, 2], 30)
    x = rng.normal(0, 0.1, (90, 4)) + np.eye(4)[y] * 3
    pred = linear_probe(x, y, {"same": x, "shifted": x + 0.05}, 3, seed=1)
    assert (pred["same"] == y).all() and (pred["shifted"] == y).all()


def test_domain_transfer_learns_english_and_retrieval_covers_every_language(corpus):
    meta = read_meta(corpus)
    ev = build_eval_set(load_split(corpus, "train"), _held_out(corpus), 2)
    tok = Tokenizer(corpus / "spm.model")
    paddle.seed(0)
    model = BertModel(preset("tiny").discriminator.replace(vocab_size=meta["vocab_size"], max_positions=24))
    ret = retrieval(Embedder(model, tok, max_len=24), ev.pairs)
    assert set(ret) == {"raw", "centred"}
    assert all(set(r) == {"es", "it", "ru", "ja"} and all(0.0 <= v <= 1.0 for v in r.values()) for r in ret.values())
    acc = finetune_transfer(model, tok, ev.train_en, ev.test, 2, steps=60, batch=32, lr=2e-3, max_len=24)
    assert set(acc) == {"en", "es", "it", "ru", "ja"}
    assert acc["en"] > 0.9  # the verb decides the domain: learnable from English alone


def test_cli_reports_every_protocol_with_a_spread_over_seeds(corpus, tmp_path, capsys):
    out = tmp_path / "eval.json"
    assert main(["--data", str(corpus), "--random", "--domains", "2", "--steps", "5", "--seeds", "2",
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
    for title in ("linear probe on the frozen encoder", "mean embedding removed", "full fine-tuning, 5 steps",
                  "cosine after centring"):
        assert title in text
    res = json.loads(out.read_text())["results"]["random"]
    assert len(res["probe"]) == len(res["finetune"]) == 2 and len(res["retrieval_raw"]["es"]) == 2
    assert "±" in text
