"""The paper's bases from PaddleNLP itself: BertModel and ErnieMModel checkpoints and tokenizers written by PaddleNLP
2.8.1's own save_pretrained load as ABNet bases that tokenize like PaddleNLP's tokenizers and compute PaddleNLP's
hidden states.

PaddleNLP 2.8.1 imports with Paddle 3.3.1 only beside older huggingface_hub (< 1), datasets (< 3), pyarrow (< 18)
and aistudio-sdk (< 0.3), which PaddleFormers 1.2.0 rules out: the `nlp` extra goes into an environment of its own
(`pip install -e '.[nlp,test]'`). Without PaddleNLP these tests are skipped; tests/recipes/test_paddlenlp_bases.py
checks the same loader on checkpoints written in PaddleNLP's format by paddle alone.
"""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("paddlenlp") is None,
    reason="needs PaddleNLP 2.8.1: pip install -e '.[nlp,test]' in an environment without the formers extra")


def _tokenizer(kind: str, d, texts):
    """PaddleNLP's own tokenizer of `kind`, built from files made for the corpus and saved into `d`."""
    from paddlenlp.transformers import BertTokenizer, ErnieMTokenizer

    from tests.recipes.test_paddlenlp_bases import save_bert, save_ernie_m

    save = save_bert if kind == "bert" else save_ernie_m
    _, vocab = save(d / "files", texts)  # vocab.txt (and sentencepiece.bpe.model) for this corpus
    if kind == "bert":
        tok = BertTokenizer(str(d / "files" / "vocab.txt"), do_lower_case=True)
    else:
        tok = ErnieMTokenizer(str(d / "files" / "vocab.txt"), str(d / "files" / "sentencepiece.bpe.model"))
    tok.save_pretrained(str(d / "ckpt"))
    return tok, vocab


@pytest.mark.parametrize("kind", ["bert", "ernie_m"])
def test_paddlenlp_checkpoint_loads_as_an_abnet_base_computing_what_paddlenlp_computes(kind, tmp_path):
    import paddle
    from paddlenlp.transformers import BertConfig, BertModel, ErnieMConfig, ErnieMModel

    from recipes.abnet.model import preset
    from recipes.abnet.pretrain import load_base
    from tests.recipes.conftest import corpus_pairs
    from tests.recipes.test_paddlenlp_bases import _hidden

    texts = [e for e, _ in corpus_pairs()] if kind == "bert" else [s for _, s in corpus_pairs()]
    nlp_tok, vocab = _tokenizer(kind, tmp_path, texts)
    sizes = dict(vocab_size=len(vocab), hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                 intermediate_size=256, max_position_embeddings=64 if kind == "bert" else 66)
    paddle.seed(3)
    model = BertModel(BertConfig(**sizes)) if kind == "bert" else ErnieMModel(ErnieMConfig(**sizes))
    model.eval()
    model.save_pretrained(str(tmp_path / "ckpt"))
    base, tok = load_base(tmp_path / "ckpt", preset("tiny").source)
    text = texts[5]
    assert tok.pieces(text) == nlp_tok.tokenize(text)  # the recipe's reader of the files splits as PaddleNLP does
    ids = tok.encode(text)
    nlp_ids = paddle.to_tensor([nlp_tok.convert_tokens_to_ids(nlp_tok.tokenize(text))])
    want = model(nlp_ids)[0].numpy()
    np.testing.assert_allclose(_hidden(base, np.array([ids])), want, rtol=1e-4, atol=1e-4)
