"""Pretrained bases on disk, as every text recipe reads and writes them: the recipes' own directories (config.json,
model.pdparams, spm.model, committed by files.json: `write_base` / `load_base`), parameter-name mapping, shape checks against the preset, and
PaddleNLP BERT / ERNIE-M checkpoints read from their on-disk format (config.json or model_config.json,
model_state.pdparams, the tokenizer's vocab.txt and sentencepiece.bpe.model) without PaddleNLP itself."""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import paddle

from nebula.recovery import durable
from recipes.text.bert import BertConfig, BertModel
from recipes.text.foreign_tokenizer import ErnieMTokenizer, WordPieceTokenizer
from recipes.text.tokenizer import Tokenizer, TokenizerBase

__all__ = ["PretrainedError", "map_foreign_names", "check_preset", "fit_state", "is_paddlenlp_dir",
           "load_paddlenlp_base", "PADDLENLP_WEIGHTS", "CONFIG_FILE", "WEIGHTS_FILE", "TOKENIZER_FILE", "FILES", "write_base",
           "save_base", "base_problem", "load_base"]

log = logging.getLogger(__name__)

PADDLENLP_WEIGHTS = "model_state.pdparams"
_CONFIGS = ("config.json", "model_config.json")
# ERNIE-M numbers positions from 2 (PaddleNLP ErnieMEmbeddings: position_ids += 2), like RoBERTa
_POSITION_OFFSET = {"bert": 0, "ernie_m": 2}
_HEAD = ("mlm_transform.", "mlm_norm.", "mlm_decoder.bias")  # a bare encoder checkpoint has no MLM head


class PretrainedError(ValueError):
    """A pretrained directory that cannot serve as a base: missing files or tensors of the wrong shape."""


def map_foreign_names(state: dict) -> dict:
    """Rename PaddleNLP BERT / ERNIE-M / ELECTRA parameter names to BertModel's; own names pass through unchanged."""
    out: dict = {}
    token_type = None
    for name, value in state.items():
        n = name
        for prefix in ("bert.", "electra.", "ernie_m.", "ernie."):
            if n.startswith(prefix):
                n = n[len(prefix):]
        n = (n.replace("embeddings.word_embeddings", "word_embeddings")
             .replace("embeddings.position_embeddings", "position_embeddings")
             .replace("embeddings.layer_norm", "embed_norm")
             .replace("encoder.layers.", "layers.")
             .replace("cls.predictions.transform", "mlm_transform")
             .replace("cls.predictions.layer_norm", "mlm_norm")
             .replace("cls.predictions.decoder_bias", "mlm_decoder.bias"))
        if n.startswith("embeddings.token_type_embeddings"):
            token_type = value
            continue
        if n == "cls.predictions.decoder_weight":  # stored [V, H] (tied to the embeddings)
            n, value = "mlm_decoder.weight", np.asarray(value).T
        if n.startswith(("pooler.", "cls.seq_relationship")):
            continue
        out[n] = value
    if token_type is not None and "position_embeddings.weight" in out:
        # Every input here is segment 0: fold that segment's embedding into the positions.
        out["position_embeddings.weight"] = np.asarray(out["position_embeddings.weight"]) + np.asarray(token_type)[0]
    if "mlm_decoder.weight" not in out and "word_embeddings.weight" in out:
        out["mlm_decoder.weight"] = np.asarray(out["word_embeddings.weight"]).T
    return out


def check_preset(cfg: BertConfig, expect: BertConfig | None, where: Path) -> None:
    """Refuse a base whose layer shapes differ from the preset's, or with fewer positions than the preset uses."""
    if expect is None:
        return
    diff = {k: (getattr(cfg, k), getattr(expect, k)) for k in ("hidden", "num_layers", "num_heads", "ff_hidden")
            if getattr(cfg, k) != getattr(expect, k)}
    if diff:
        raise PretrainedError(f"pretrained directory {where} has the wrong shape: " + ", ".join(
            f"{k}={a} (the preset expects {b})" for k, (a, b) in diff.items())
            + "; choose the preset that matches the checkpoint (BERT-base sized: paper) or point at the right "
              "directory")
    if cfg.max_positions < expect.max_positions:
        raise PretrainedError(f"pretrained directory {where} has {cfg.max_positions} positions but the preset uses "
                              f"{expect.max_positions}; the base is too small for the preset's sequence length: "
                              "use a base with more positions or a preset with a shorter max length")


def fit_state(model: BertModel, state: dict, where: Path, optional: tuple[str, ...] = ()) -> None:
    """Load `state` into `model` after checking every tensor's shape; names starting with `optional` may be missing
    (they keep the model's initialisation)."""
    own = model.state_dict()
    problems, kept = [], []
    for name, param in own.items():
        if name not in state:
            (kept if name.startswith(optional) else problems).append(f"{name}: missing")
            continue
        got = tuple(np.shape(state[name]))
        if got != tuple(param.shape):
            problems.append(f"{name}: shape {list(got)}, expected {list(param.shape)}")
    if problems:
        raise PretrainedError(f"pretrained weights in {where} do not fit the configuration: "
                              + "; ".join(problems[:6]) + (f" (+{len(problems) - 6} more)" if len(problems) > 6 else "")
                              + ". Re-run the pretraining or fix the config file to the checkpoint's sizes")
    if kept:
        log.warning("%s has no MLM head (%d tensors): the output layer starts from the tied word embeddings and a "
                    "fresh transform; train it (train_output_layer) before relying on its predictions", where, len(kept))
    model.set_state_dict({k: state[k] if k in state else v for k, v in own.items()})


def is_paddlenlp_dir(d: Path) -> bool:
    """True if `d` holds a PaddleNLP checkpoint (model_state.pdparams)."""
    return (Path(d) / PADDLENLP_WEIGHTS).is_file()


def _read_config(d: Path) -> tuple[str, dict[str, Any]]:
    """(model kind 'bert' | 'ernie_m', flat config) from config.json or the older model_config.json."""
    f = next((d / n for n in _CONFIGS if (d / n).is_file()), None)
    if f is None:
        raise PretrainedError(f"{d} has {PADDLENLP_WEIGHTS} but neither config.json nor model_config.json; save the "
                              "model with save_pretrained(dir), which writes both")
    doc = json.loads(f.read_text())
    if "init_args" in doc:  # PaddleNLP < 2.5: {"init_class": "BertModel", "init_args": [{...}]}
        args = doc["init_args"][0] if isinstance(doc["init_args"], list) and doc["init_args"] else {}
        doc = {**args, "architectures": [doc.get("init_class", "")]}
    names = [str(doc.get("model_type", ""))] + [str(a) for a in doc.get("architectures", [])]
    text = " ".join(names).lower().replace("-", "_")
    kind = "ernie_m" if "ernie_m" in text or "erniem" in text else "bert" if "bert" in text else ""
    if not kind:
        raise PretrainedError(f"{f}: model type {names} is not BERT or ERNIE-M; the recipe loads PaddleNLP BertModel "
                              "and ErnieMModel checkpoints (or its own bases: config.json, model.pdparams, spm.model)")
    act = doc.get("hidden_act", "gelu")
    if act != "gelu":
        raise PretrainedError(f"{f}: hidden_act={act!r}; the recipe's base runs GELU layers (BERT's and ERNIE-M's)")
    return kind, doc


def load_paddlenlp_base(path: str | Path, expect: BertConfig | None = None) -> tuple[BertModel, Any]:
    """A PaddleNLP BertModel or ErnieMModel checkpoint directory as a frozen base, with its own tokenizer.

    Ids are the checkpoint's with [PAD], [UNK], [MASK], [CLS] moved to the recipe's ids 0-3; the word embeddings and
    the MLM head are permuted alike, so the model computes exactly what the checkpoint did. A vocab.txt whose size
    differs from the checkpoint's vocabulary, or a base whose shape or positions do not fit the preset, stops here.
    """
    d = Path(path)
    kind, doc = _read_config(d)
    try:
        tok = WordPieceTokenizer(d) if kind == "bert" else ErnieMTokenizer(d)
    except (FileNotFoundError, ValueError) as exc:
        raise PretrainedError(str(exc)) from exc
    offset = _POSITION_OFFSET[kind]
    try:
        cfg = BertConfig(vocab_size=int(doc["vocab_size"]), hidden=int(doc["hidden_size"]),
                         num_layers=int(doc["num_hidden_layers"]), num_heads=int(doc["num_attention_heads"]),
                         ff_hidden=int(doc["intermediate_size"]),
                         max_positions=int(doc["max_position_embeddings"]) - offset,
                         dropout=float(doc.get("hidden_dropout_prob", 0.1)))
    except (KeyError, TypeError, ValueError) as exc:
        raise PretrainedError(f"{d}: config lacks or has a bad {exc}; expected PaddleNLP's vocab_size, hidden_size, "
                              "num_hidden_layers, num_attention_heads, intermediate_size, max_position_embeddings") \
            from exc
    if tok.vocab_size != cfg.vocab_size:
        raise PretrainedError(f"{d}: vocab.txt has {tok.vocab_size} tokens but the model's vocab_size is "
                              f"{cfg.vocab_size}; the tokenizer files belong to another checkpoint: save the model and "
                              "its tokenizer together (model.save_pretrained(dir); tokenizer.save_pretrained(dir))")
    check_preset(cfg, expect, d)
    state = {k: np.asarray(v) for k, v in paddle.load(str(d / PADDLENLP_WEIGHTS), return_numpy=True).items()}
    emb = state.get("embeddings.word_embeddings.weight", state.get(f"{kind}.embeddings.word_embeddings.weight"))
    if emb is not None and emb.shape[0] != tok.vocab_size:
        raise PretrainedError(f"{d}: word embeddings have {emb.shape[0]} rows but vocab.txt has {tok.vocab_size} "
                              "tokens; the tokenizer files belong to another checkpoint")
    state = map_foreign_names(state)
    if offset and "position_embeddings.weight" in state:
        state["position_embeddings.weight"] = state["position_embeddings.weight"][offset:]
    perm = tok.to_ckpt  # recipe id -> checkpoint id
    for name, axis in (("word_embeddings.weight", 0), ("mlm_decoder.weight", 1), ("mlm_decoder.bias", 0)):
        if name in state:
            state[name] = np.take(state[name], perm, axis=axis)
    model = BertModel(cfg)
    fit_state(model, state, d / PADDLENLP_WEIGHTS, optional=_HEAD)
    return model, tok


CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE, FILES = "config.json", "model.pdparams", "spm.model", "files.json"


def write_base(out_dir: str | Path, state: dict, cfg: dict, tokenizer: str | Path) -> Path:
    """Write a base directory: weights `state`, config `cfg`, a copy of the tokenizer model, then files.json."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / FILES).unlink(missing_ok=True)  # written again: uncommitted until the new files are all in place
    spm = Path(tokenizer).read_bytes()
    files = {WEIGHTS_FILE: durable.write_atomic(out / WEIGHTS_FILE, lambda p: paddle.save(state, str(p))),
             TOKENIZER_FILE: durable.write_atomic(out / TOKENIZER_FILE, lambda p: p.write_bytes(spm)),
             CONFIG_FILE: durable.write_atomic(out / CONFIG_FILE, lambda p: p.write_text(json.dumps(cfg, indent=1)))}
    durable.write_marker(out / FILES, {"files": files})
    return out


def save_base(model: BertModel, tok: Tokenizer, out_dir: str | Path) -> Path:
    """Write config.json, model.pdparams and spm.model of one base into `out_dir` (files.json last)."""
    return write_base(out_dir, model.state_dict(), model.cfg.to_dict(), tok.path)


def base_problem(d: Path) -> str | None:
    """Why base directory `d` (one a recipe wrote) cannot be loaded: files missing or not matching files.json."""
    missing = [f for f in (CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE) if not (d / f).is_file()]
    if missing:
        return f"lacks {', '.join(missing)}"
    if not (d / FILES).is_file():
        return None  # written before files.json existed, or by hand
    try:
        return durable.check_files(d, durable.read_marker(d / FILES)["files"])
    except durable.CheckpointError as exc:
        return str(exc)


def load_base(path: str | Path, expect: BertConfig | None = None) -> tuple[BertModel, TokenizerBase]:
    """Load one base from `path`: the recipe's own (config.json, model.pdparams, spm.model) or a PaddleNLP BERT /
    ERNIE-M checkpoint with its own tokenizer; every tensor's shape is checked before anything trains."""
    d = Path(path)
    if is_paddlenlp_dir(d):
        return load_paddlenlp_base(d, expect)
    problem = base_problem(d)
    if problem:
        raise PretrainedError(f"pretrained directory {d}: {problem}; it needs config.json, model.pdparams and "
                              "spm.model as written together by save_base / the recipe's pretraining (delete it to "
                              f"pretrain again), or a PaddleNLP checkpoint ({PADDLENLP_WEIGHTS}, config.json and its "
                              "tokenizer files)")
    try:
        cfg = BertConfig(**json.loads((d / CONFIG_FILE).read_text()))
    except (TypeError, ValueError) as exc:
        raise PretrainedError(f"{d / CONFIG_FILE}: not a BertConfig ({exc})") from exc
    check_preset(cfg, expect, d)
    tok = Tokenizer(d / TOKENIZER_FILE)
    if tok.vocab_size != cfg.vocab_size:
        raise PretrainedError(f"{d}: tokenizer has {tok.vocab_size} pieces but config.json says vocab_size="
                              f"{cfg.vocab_size}; the tokenizer and weights come from different runs")
    model = BertModel(cfg)
    fit_state(model, map_foreign_names(paddle.load(str(d / WEIGHTS_FILE))), d / WEIGHTS_FILE)
    return model, tok
