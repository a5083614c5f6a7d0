"""PaddleNLP BERT and ERNIE-M checkpoints as ABNet bases, with their own tokenizers (WordPiece vocab.txt;
sentencepiece.bpe.model + vocab.txt).

The fixtures are tiny randomly initialised models written in PaddleNLP's on-disk format by paddle itself:
config.json as PaddleNLP's save_pretrained writes it, model_state.pdparams from layers with PaddleNLP's module
layout (embeddings.*, encoder = paddle.nn.TransformerEncoder, pooler.dense), vocab.txt (one token per line) and
tokenizer_config.json. PaddleNLP itself is not installed: every release (2.8.1, 3.0.0b4) pins numpy <= 1.26.4,
below the numpy this project runs on."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import paddle
import paddle.nn as nn
import pytest
import yaml

from nebula.config.job import load_job_config
from nebula.modes import run
from recipes.text.catalogs import DataConfig, prepare_data
from recipes.abnet.model import padding_bias, preset
from recipes.abnet.pretrain import PretrainedError, load_base
from recipes.text.tokenizer import CLS_ID, MASK_ID, PAD_ID, UNK_ID
from tests.recipes.conftest import corpus_pairs

TINY = preset("tiny").source  # hidden 64, 2 layers, 2 heads, FF 256, 32 positions


class _Embeddings(nn.Layer):
    def __init__(self, vocab: int, hidden: int, positions: int, token_types: int) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, hidden)
        self.position_embeddings = nn.Embedding(positions, hidden)
        if token_types:
            self.token_type_embeddings = nn.Embedding(token_types, hidden)
        self.layer_norm = nn.LayerNorm(hidden)


class _Pooler(nn.Layer):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)


class NlpModel(nn.Layer):
    """PaddleNLP BertModel / ErnieMModel parameter layout and forward (eval mode, one segment, no padding)."""

    def __init__(self, kind: str, vocab: int, positions: int, hidden: int = 64, layers: int = 2, heads: int = 2,
                 ff: int = 256) -> None:
        super().__init__()
        self.kind = kind
        self.embeddings = _Embeddings(vocab, hidden, positions, 2 if kind == "bert" else 0)
        layer = nn.TransformerEncoderLayer(hidden, heads, ff, dropout=0.1, activation="gelu", attn_dropout=0.1,
                                           act_dropout=0)
        self.encoder = nn.TransformerEncoder(layer, layers)
        self.pooler = _Pooler(hidden)

    def forward(self, ids: paddle.Tensor) -> paddle.Tensor:
        pos = paddle.arange(ids.shape[1], dtype="int64").unsqueeze(0) + (2 if self.kind == "ernie_m" else 0)
        e = self.embeddings.word_embeddings(ids) + self.embeddings.position_embeddings(pos)
        if self.kind == "bert":
            e = e + self.embeddings.token_type_embeddings(paddle.zeros_like(ids))
        return self.encoder(self.embeddings.layer_norm(e))


def _config(kind: str, vocab: int, positions: int) -> dict:
    arch = {"bert": "BertModel", "ernie_m": "ErnieMModel"}[kind]
    return {"architectures": [arch], "model_type": kind, "vocab_size": vocab, "hidden_size": 64,
            "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 256, "hidden_act": "gelu",
            "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1, "max_position_embeddings": positions,
            "type_vocab_size": 2 if kind == "bert" else 16, "initializer_range": 0.02,
            "pad_token_id": 0 if kind == "bert" else 1, "paddlenlp_version": "2.8.1"}


def _save_model(d: Path, kind: str, vocab: list[str], positions: int, seed: int) -> NlpModel:
    """Random weights (model_state.pdparams) and config.json of a tiny `kind` model, as save_pretrained writes them."""
    paddle.seed(seed)
    model = NlpModel(kind, len(vocab), positions)
    model.eval()
    paddle.save(model.state_dict(), str(d / "model_state.pdparams"))
    (d / "config.json").write_text(json.dumps(_config(kind, len(vocab), positions)))
    return model


def save_bert(d: Path, texts: list[str], positions: int = 64, seed: int = 0) -> tuple[NlpModel, list[str]]:
    """A tiny random BERT in PaddleNLP's format, with a WordPiece vocab.txt of the corpus's words (BERT's special
    ids: [PAD] 0, [UNK] 100, [CLS] 101, [SEP] 102, [MASK] 103)."""
    words = sorted({w for t in texts for w in re.findall(r"\w+|[^\w\s]", t.lower())})
    pieces = sorted({w[:3] for w in words} | {"##" + w[3:] for w in words if len(w) > 3})
    vocab = ["[PAD]"] + [f"[unused{i}]" for i in range(99)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"] + pieces
    d.mkdir(parents=True, exist_ok=True)
    (d / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    (d / "tokenizer_config.json").write_text(json.dumps({
        "do_lower_case": True, "unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
        "mask_token": "[MASK]", "tokenizer_class": "BertTokenizer"}))
    return _save_model(d, "bert", vocab, positions, seed), vocab


def save_ernie_m(d: Path, texts: list[str], positions: int = 66, seed: int = 1) -> tuple[NlpModel, list[str]]:
    """A tiny random ERNIE-M in PaddleNLP's format: a BPE sentencepiece.bpe.model trained on the corpus and a
    vocab.txt of its pieces after ERNIE-M's specials ([PAD] 0, [CLS] 1, [SEP] 2, [UNK] 3, [MASK] 4)."""
    import sentencepiece as spm

    d.mkdir(parents=True, exist_ok=True)
    spm.SentencePieceTrainer.train(sentence_iterator=iter(texts), model_prefix=str(d / "sentencepiece.bpe"),
                                   vocab_size=200, model_type="bpe", character_coverage=1.0,
                                   hard_vocab_limit=False, num_threads=1, minloglevel=2)
    sp = spm.SentencePieceProcessor(model_file=str(d / "sentencepiece.bpe.model"))
    vocab = ["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"] + [
        sp.id_to_piece(i) for i in range(sp.get_piece_size()) if not sp.is_control(i) and not sp.is_unknown(i)]
    vocab += sorted({c for t in texts for c in t if not c.isspace()} - set(vocab))  # single characters
    (d / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    (d / "tokenizer_config.json").write_text(json.dumps({
        "do_lower_case": False, "unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]",
        "cls_token": "[CLS]", "mask_token": "[MASK]", "tokenizer_class": "ErnieMTokenizer"}))
    return _save_model(d, "ernie_m", vocab, positions, seed), vocab


def _hidden(base, ids: np.ndarray) -> np.ndarray:
    base.eval()
    x = base.embed(paddle.to_tensor(ids))
    for layer in base.layers:
        x = layer(x, padding_bias(paddle.to_tensor(ids)))
    return x.numpy()


@pytest.mark.parametrize("kind", ["bert", "ernie_m"])
def test_checkpoint_loads_with_its_tokenizer_and_computes_what_it_saved(kind, tmp_path):
    """Names mapped, special ids moved to the recipe's 0-3 with the embedding rows permuted alike, ERNIE-M's
    position offset honoured: the loaded base's hidden states equal the checkpoint model's on the same text."""
    texts = [e for e, _ in corpus_pairs()] if kind == "bert" else [s for _, s in corpus_pairs()]
    saved, vocab = (save_bert if kind == "bert" else save_ernie_m)(tmp_path / kind, texts)
    base, tok = load_base(tmp_path / kind, TINY)
    assert base.cfg.vocab_size == tok.vocab_size == len(vocab)
    assert base.cfg.max_positions == 64  # ERNIE-M: 66 positions less its offset of 2
    text = texts[3]
    ids = tok.encode(text)
    assert ids and min(ids) >= 4 and UNK_ID not in ids  # every piece is in vocab.txt; no special id
    assert tok.decode(ids).lower().replace(" ", "") == text.lower().replace(" ", "")
    assert tok.decode([PAD_ID, CLS_ID, MASK_ID, *ids]) == tok.decode(ids)
    specials = {"[PAD]": PAD_ID, "[UNK]": UNK_ID, "[MASK]": MASK_ID, "[CLS]": CLS_ID}
    for token, rid in specials.items():  # the recipe's special ids use the checkpoint's special embeddings
        np.testing.assert_array_equal(base.word_embeddings.weight.numpy()[rid],
                                      saved.embeddings.word_embeddings.weight.numpy()[vocab.index(token)])
    ckpt_ids = np.array([[vocab.index(p) for p in tok.pieces(text)]])
    want = saved(paddle.to_tensor(ckpt_ids)).numpy()
    np.testing.assert_allclose(_hidden(base, np.array([ids])), want, rtol=1e-4, atol=1e-4)


def test_mismatched_vocab_too_few_positions_and_wrong_size_are_refused(tmp_path):
    texts = [e for e, _ in corpus_pairs()]
    d = tmp_path / "bert"
    save_bert(d, texts)
    lines = (d / "vocab.txt").read_text().splitlines()
    (d / "vocab.txt").write_text("\n".join(lines[:-1]) + "\n")  # one token short
    with pytest.raises(PretrainedError, match=r"vocab.txt has \d+ tokens but the model's vocab_size is \d+.*"
                                              r"tokenizer files belong to another checkpoint"):
        load_base(d, TINY)
    save_bert(d, texts, positions=16)
    with pytest.raises(PretrainedError, match=r"has 16 positions but the preset uses 32.*more positions"):
        load_base(d, TINY)
    save_bert(d, texts)
    with pytest.raises(PretrainedError, match=r"hidden=64 \(the preset expects 768\).*paper"):
        load_base(d, preset("paper").source)
    (d / "tokenizer_config.json").write_text(json.dumps({"mask_token": "<mask>"}))
    with pytest.raises(PretrainedError, match=r"lacks the special token\(s\) \['<mask>'\]"):
        load_base(d, TINY)


def test_recipe_trains_on_a_bert_encoder_and_an_ernie_m_decoder(locale_dir, tmp_path):
    """The training YAML names the two checkpoints; encoder and decoder stages run through the runtime, use the
    checkpoints' tokenizers, and the loss falls."""
    prepare_data(tmp_path / "A", tmp_path / "B", ["es"], locale_dir, DataConfig(test_per_mille=100,
                                                                                  dev_per_mille=100))
    save_bert(tmp_path / "bert", [e for e, _ in corpus_pairs()])
    save_ernie_m(tmp_path / "ernie_m", [s for _, s in corpus_pairs()])
    train = {"preset": "tiny", "steps": 30, "batch_size": 16, "lr": 0.005, "warmup_steps": 5, "max_len": 12,
             "eval_batch": 64, "source_pretrained": str(tmp_path / "bert"),
             "target_pretrained": str(tmp_path / "ernie_m")}
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(train))
    job = {"job": "abnet-nlp", "recipe": {"factory": "recipes.abnet:ABNetRecipe", "args": {
               "config": str(tmp_path / "train.yaml"), "encoder_data": str(tmp_path / "A"),
               "decoder_data": str(tmp_path / "B"), "encoder_work": str(tmp_path / "wa"),
               "decoder_work": str(tmp_path / "wb")}},
           "clusters": [{"id": "A"}], "stages": [{"name": "encoder", "cluster": "A"}, {"name": "decoder", "cluster": "A"}],
           "train": {"steps": 30, "global_batch": 16, "micro_batches": 2, "seed": 0},
           "metrics": {"dir": str(tmp_path / "metrics"), "progress": False}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job, sort_keys=False))
    losses = run(load_job_config(tmp_path / "job.yaml"), "A", workdir=tmp_path).losses
    assert np.mean([losses[s] for s in range(25, 30)]) < np.mean([losses[s] for s in range(5)]) - 0.3, losses
    assert not (tmp_path / "wa" / "base_en").exists()  # nothing pretrained: the checkpoints were used


def test_wordpiece_splits_like_bert_and_moves_special_ids(tmp_path):
    from recipes.text.foreign_tokenizer import WordPieceTokenizer

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "world", "!", ",", "un", "##aff", "##able", "中"]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    tok = WordPieceTokenizer(tmp_path)  # no tokenizer_config.json: BertTokenizer's defaults (lower-casing)
    assert tok.pieces("Héllo, WORLD! unaffable 中xyz") == ["hello", ",", "world", "!", "un", "##aff", "##able", "中",
                                                            "[UNK]"]
    ids = tok.encode("hello unaffable qq")
    assert ids[-1] == UNK_ID and len(ids) == 5
    assert [int(tok.to_ckpt[i]) for i in (PAD_ID, UNK_ID, MASK_ID, CLS_ID)] == [0, 1, 4, 2]
    assert tok.decode(ids) == "hello unaffable"  # ## pieces joined, [UNK] dropped
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False}))
    assert WordPieceTokenizer(tmp_path).pieces("Hello") == ["[UNK]"]
