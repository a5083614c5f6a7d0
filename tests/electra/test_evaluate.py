"""Downstream evaluation pieces: English fine-tuning of the domain classifier learns; retrieval scores each language."""
from __future__ import annotations

import paddle

from recipes.abnet.model import BertModel
from recipes.abnet.tokenizer import Tokenizer
from recipes.electra.data import read_meta
from recipes.electra.evaluate import domain_labels, finetune_transfer, load_split, retrieval
from recipes.electra.model import preset


def test_domain_transfer_learns_english_and_retrieval_covers_every_language(corpus):
    meta = read_meta(corpus)
    train, test = load_split(corpus, "train"), load_split(corpus, "test")
    labels = domain_labels(train, 2)
    assert sorted(labels) == ["files", "images"]
    tok = Tokenizer(corpus / "spm.model")
    paddle.seed(0)
    model = BertModel(preset("tiny").discriminator.replace(vocab_size=meta["vocab_size"], max_positions=24))
    acc = finetune_transfer(model, tok, train, test, labels, steps=60, batch=32, lr=2e-3, max_len=24)
    assert set(acc) == {"en", "es", "it", "ru", "ja"}
    assert acc["en"] > 0.9  # the verb decides the domain: learnable from English alone
    ret = retrieval(model, tok, test, max_len=24)
    assert set(ret) == {"es", "it", "ru", "ja"} and all(0.0 <= v <= 1.0 for v in ret.values())
