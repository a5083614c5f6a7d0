"""Tokenizer, ABNet model shapes and frozen bases, mask-predict decoding, pretrained-base loading, a short training."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import paddle
import pytest

from recipes.abnet.decode import mask_predict
from recipes.abnet.model import (AbnetConfig, AbnetDecoder, AbnetEncoder, BertConfig, BertModel, CmlmObjective,
                                 cmlm_mask, preset, source_keep_mask)
from recipes.abnet.pretrain import PretrainedError, ensure_base, load_base, save_base
from recipes.text.tokenizer import CLS_ID, MASK_ID, NUM_SPECIAL, PAD_ID, UNK_ID, Tokenizer, train_tokenizer
from tests.recipes.conftest import corpus_pairs

MICRO = BertConfig(vocab_size=120, hidden=32, num_layers=2, num_heads=2, ff_hidden=64, max_positions=16, dropout=0.0)


def micro_cfg(**kw) -> AbnetConfig:
    return AbnetConfig(source=MICRO, target=MICRO, encoder_adapter_hidden=48, decoder_adapter_hidden=32,
                       decoder_adapter_heads=2, max_target_len=12, adapter_dropout=0.0, **kw)


@pytest.fixture(scope="module")
def toks(tmp_path_factory):
    d = tmp_path_factory.mktemp("tok")
    en = train_tokenizer([e for e, _ in corpus_pairs()], d / "en.model", vocab_size=60)
    es = train_tokenizer([s for _, s in corpus_pairs()], d / "es.model", vocab_size=60)
    return en, es


def test_tokenizer_special_ids_and_padding(toks):
    en, _ = toks
    assert en.sp.pad_id() == PAD_ID and en.sp.unk_id() == UNK_ID
    assert en.sp.piece_to_id("[MASK]") == MASK_ID and en.sp.piece_to_id("[CLS]") == CLS_ID
    batch = en.batch(["open file", "delete the selected folder now"], max_len=6)
    assert batch.dtype == np.int64 and batch.shape[0] == 2 and batch.shape[1] <= 6
    assert (batch[0][len(en.encode("open file")):] == PAD_ID).all()
    assert en.decode(en.encode("open file")) == "open file"
    assert en.decode([MASK_ID, PAD_ID, *en.encode("menu")]) == "menu"  # specials never reach the text


def test_tokenizer_errors(tmp_path):
    with pytest.raises(ValueError, match="no texts"):
        train_tokenizer([], tmp_path / "x.model")
    with pytest.raises(FileNotFoundError, match="train_tokenizer"):
        Tokenizer(tmp_path / "missing.model")


def test_shapes_frozen_bases_and_zero_padding():
    paddle.seed(0)
    cfg = micro_cfg()
    enc, dec = AbnetEncoder(cfg), AbnetDecoder(cfg)
    src = paddle.to_tensor(np.array([[5, 6, 7, 0, 0], [8, 9, 10, 11, 12]], dtype="int64"))
    h = enc(src)
    assert h.shape == [2, 5, 32]
    assert float(h[0, 3:].abs().sum()) == 0.0 and float(h[0, :3].abs().sum()) > 0
    np.testing.assert_array_equal(source_keep_mask(h).numpy(), [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    tgt = paddle.to_tensor(np.array([[20, 21, 0], [22, 23, 24]], dtype="int64"))
    logits, len_logits = dec(h, tgt)
    assert logits.shape == [2, 3, 120] and len_logits.shape == [2, 13]
    # bases frozen, adapters (and the decoder's output layer and length predictor) trainable
    assert all(p.stop_gradient for p in enc.base.parameters())
    assert all(not p.stop_gradient for p in enc.adapters.parameters())
    head = {id(p) for m in (dec.base.mlm_transform, dec.base.mlm_norm, dec.base.mlm_decoder) for p in m.parameters()}
    assert all(p.stop_gradient for p in dec.base.parameters() if id(p) not in head)
    assert all(not p.stop_gradient for p in dec.adapters.parameters()) and not dec.length_proj.weight.stop_gradient
    frozen = AbnetDecoder(micro_cfg(train_output_layer=False))
    assert all(p.stop_gradient for p in frozen.base.parameters())
    # one optimizer step changes adapters, never the bases
    before = {k: v.numpy().copy() for k, v in enc.base.state_dict().items()}
    params = [p for m in (enc, dec) for p in m.parameters() if not p.stop_gradient]
    opt = paddle.optimizer.Adam(1e-2, parameters=params)
    ad0 = enc.adapters[0].up.weight.numpy().copy()
    CmlmObjective(dec)(enc(src), tgt).backward()
    opt.step()
    assert all(np.array_equal(before[k], v.numpy()) for k, v in enc.base.state_dict().items())
    assert not np.array_equal(ad0, enc.adapters[0].up.weight.numpy())


def test_padding_mask_survives_boundary_codecs():
    from nebula.compress import get_codec

    paddle.seed(1)
    enc = AbnetEncoder(micro_cfg())
    src = paddle.to_tensor(np.array([[5, 6, 7, 0, 0, 0], [8, 9, 10, 11, 12, 13]] * 4, dtype="int64"))
    h = enc(src).numpy()
    for spec in ("fp16(svd(0.6))", "fp16(svd(0.2))", "int8", "fp16"):
        codec = get_codec(spec)
        got = source_keep_mask(paddle.to_tensor(codec.decode(codec.encode(h)))).numpy()
        np.testing.assert_array_equal(got, (src.numpy() != PAD_ID).astype("float32"), err_msg=spec)


def test_cmlm_mask_masks_between_one_and_all_real_tokens():
    paddle.seed(3)
    tgt = paddle.to_tensor(np.array([[9, 9, 9, 9, 0, 0], [9, 9, 9, 9, 9, 9]] * 50, dtype="int64"))
    tgt_in, masked = cmlm_mask(tgt)
    m = masked.numpy()
    assert not m[:, 4:][::2].any()  # pads never masked
    counts = m.sum(1)
    assert counts.min() >= 1 and counts[::2].max() <= 4 and counts[1::2].max() <= 6
    assert len(set(counts[1::2])) > 3  # the number of masks varies
    assert (tgt_in.numpy()[m] == MASK_ID).all() and (tgt_in.numpy()[~m] == tgt.numpy()[~m]).all()


def test_mask_predict_lengths_and_tokens():
    paddle.seed(2)
    dec = AbnetDecoder(micro_cfg())
    h = paddle.randn([3, 5, 32])
    out = mask_predict(dec, h, length_beam=3, iterations=3)
    assert len(out) == 3
    len_logits = dec.predict_length(h, source_keep_mask(h)).numpy()
    len_logits[:, 0] = -np.inf
    top = np.argsort(-len_logits, axis=1)[:, :3]
    for row, cands in zip(out, top):
        assert len(row) in set(cands.tolist()) and all(t >= NUM_SPECIAL for t in row)
    with pytest.raises(ValueError, match="length_beam"):
        mask_predict(dec, h, length_beam=0)


def _ids(tok, texts, width):
    return paddle.to_tensor(tok.batch(texts, width))


def test_short_training_lowers_loss_and_translates_training_phrases(toks):
    en, es = toks
    paddle.seed(0)
    cfg = dataclasses.replace(micro_cfg(), source=MICRO.replace(vocab_size=en.vocab_size),
                              target=MICRO.replace(vocab_size=es.vocab_size))
    enc, dec = AbnetEncoder(cfg), AbnetDecoder(cfg)
    obj = CmlmObjective(dec)
    pairs = corpus_pairs()[:24]
    src, tgt = _ids(en, [p[0] for p in pairs], 12), _ids(es, [p[1] for p in pairs], 12)
    params = [p for m in (enc, dec) for p in m.parameters() if not p.stop_gradient]
    opt = paddle.optimizer.Adam(5e-3, parameters=params)
    losses = []
    for _ in range(120):
        loss = obj(enc(src), tgt)
        loss.backward()
        opt.step()
        opt.clear_grad()
        losses.append(float(loss))
    assert np.mean(losses[-10:]) < 0.5 * np.mean(losses[:10]), (losses[:10], losses[-10:])
    enc.eval()
    hyps = [es.decode(r) for r in mask_predict(dec, enc(src), length_beam=2, iterations=4)]
    exact = sum(h == p[1] for h, p in zip(hyps, pairs))
    assert exact >= len(pairs) // 3, list(zip(hyps, pairs))


def test_pretrained_base_roundtrip_and_wrong_shape(toks, tmp_path):
    en, _ = toks
    paddle.seed(0)
    model = BertModel(MICRO.replace(vocab_size=en.vocab_size))
    d = save_base(model, en, tmp_path / "base")
    loaded, tok = load_base(d, MICRO)
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(v.numpy(), loaded.state_dict()[k].numpy())
    with pytest.raises(PretrainedError, match=r"hidden=32 \(the preset expects 64\)"):
        load_base(d, MICRO.replace(hidden=64))
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "ff_hidden": 80}))
    with pytest.raises(PretrainedError, match="config.json does not have the digest"):  # files.json names it
        load_base(d)
    (d / "files.json").unlink()  # a base put together by hand: its files are taken as they are
    with pytest.raises(PretrainedError, match=r"linear1.weight: shape \[32, 64\], expected \[32, 80\]"):
        load_base(d)
    (d / "config.json").unlink()
    with pytest.raises(PretrainedError, match="lacks config.json"):
        ensure_base(tmp_path / "w", ["x"], MICRO, pretrained=d)


def test_a_base_whose_save_was_cut_short_is_pretrained_again(toks, tmp_path, caplog):
    """save_base writes files.json last: without it (a kill during the save) the cached base is not trusted."""
    en, _ = toks
    paddle.seed(0)
    d = save_base(BertModel(MICRO.replace(vocab_size=en.vocab_size)), en, tmp_path / "base")
    (d / "files.json").unlink()
    (d / "model.pdparams").write_bytes((d / "model.pdparams").read_bytes()[:1000])  # as a kill before renames did
    with caplog.at_level("WARNING"):
        model, _ = ensure_base(d, ["hello world"] * 8, MICRO.replace(vocab_size=en.vocab_size), steps=1,
                               vocab_size=40)
    assert any("no files.json: its save was cut short" in r.getMessage() for r in caplog.records)
    assert (d / "files.json").is_file()
    loaded, _ = load_base(d, MICRO)  # the new save verifies and loads
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(v.numpy(), loaded.state_dict()[k].numpy())


def test_paddlenlp_bert_names_load(toks, tmp_path):
    en, _ = toks
    paddle.seed(0)
    model = BertModel(MICRO.replace(vocab_size=en.vocab_size))
    d = save_base(model, en, tmp_path / "nlp")
    sd = {k: v.numpy() for k, v in model.state_dict().items()}
    renamed = {}
    for k, v in sd.items():
        k2 = (k.replace("word_embeddings", "bert.embeddings.word_embeddings")
              .replace("position_embeddings", "bert.embeddings.position_embeddings")
              .replace("embed_norm", "bert.embeddings.layer_norm").replace("layers.", "bert.encoder.layers.")
              .replace("mlm_transform", "cls.predictions.transform").replace("mlm_norm", "cls.predictions.layer_norm"))
        if k == "mlm_decoder.weight":
            k2, v = "cls.predictions.decoder_weight", v.T
        if k == "mlm_decoder.bias":
            k2 = "cls.predictions.decoder_bias"
        renamed[k2] = v
    renamed["bert.embeddings.token_type_embeddings.weight"] = np.ones((2, 32), dtype="float32")
    paddle.save(renamed, str(d / "model.pdparams"))
    (d / "files.json").unlink()  # put together by hand
    loaded, _ = load_base(d, MICRO)
    np.testing.assert_allclose(loaded.position_embeddings.weight.numpy(), sd["position_embeddings.weight"] + 1.0)
    np.testing.assert_array_equal(loaded.mlm_decoder.weight.numpy(), sd["mlm_decoder.weight"])


def test_masked_lm_pretraining_learns(toks, tmp_path):
    en, _ = toks
    texts = [e for e, _ in corpus_pairs()]
    paddle.seed(0)
    base, tok = ensure_base(tmp_path / "b", texts, MICRO, steps=80, vocab_size=60, seed=0)
    losses = json.loads((tmp_path / "b" / "pretrain_losses.json").read_text())
    assert np.mean(losses[-10:]) < 0.85 * np.mean(losses[:10])
    again, _ = ensure_base(tmp_path / "b", texts, MICRO, steps=80, vocab_size=60)  # cached: loads, no retraining
    np.testing.assert_array_equal(again.word_embeddings.weight.numpy(), base.word_embeddings.weight.numpy())


def test_presets():
    assert preset("paper").source.hidden == 768 and preset("paper").encoder_adapter_hidden == 512
    assert preset("paper").decoder_adapter_hidden == 768 and preset("paper").max_target_len == 64
    with pytest.raises(ValueError, match="choose one of"):
        preset("huge")
    with pytest.raises(ValueError, match="not divisible"):
        BertConfig(hidden=30, num_heads=4)
