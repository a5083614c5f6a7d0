"""ABNet adapter fine-tuning across two clusters (Nebula-I Scenario II): data, tokenizers, model, training, decoding.

Public API: `prepare_data` (gettext catalogs -> per-cluster sides), `Tokenizer`/`train_tokenizer`, model classes and
presets (`preset("tiny"|"small"|"paper")`), `ensure_base`/`load_base`/`mlm_pretrain` (`load_base` also reads PaddleNLP
BERT / ERNIE-M checkpoints with their own tokenizers: `load_paddlenlp_base`), `mask_predict`, `bleu`,
`TrainConfig`, `train_single` and `ABNetRecipe` (the `nebula.pipeline` recipe: stages "encoder" and "decoder").
Heavy modules (Paddle) load on first use so `import recipes.abnet` stays cheap. What the text recipes share (BERT,
tokenizers, gettext catalogs, bases on disk) lives in `recipes.text`.
"""
from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "prepare_data", "DataConfig", "CatalogError", "Tokenizer", "train_tokenizer", "AbnetConfig", "BertConfig",
    "preset", "PRESETS", "AbnetEncoder", "AbnetDecoder", "ensure_base", "load_base", "mlm_pretrain",
    "PretrainedError", "load_paddlenlp_base", "mask_predict", "bleu", "plot_losses", "TrainConfig", "train_single", "ABNetRecipe",
]

_TEXT = "recipes.text"
_WHERE = {
    "prepare_data": f"{_TEXT}.catalogs", "DataConfig": f"{_TEXT}.catalogs", "CatalogError": f"{_TEXT}.catalogs",
    "Tokenizer": f"{_TEXT}.tokenizer", "train_tokenizer": f"{_TEXT}.tokenizer",
    "AbnetConfig": f"{__name__}.model", "BertConfig": f"{_TEXT}.bert", "preset": f"{__name__}.model",
    "PRESETS": f"{__name__}.model", "AbnetEncoder": f"{__name__}.model", "AbnetDecoder": f"{__name__}.model",
    "ensure_base": f"{__name__}.pretrain", "load_base": f"{_TEXT}.base", "mlm_pretrain": f"{__name__}.pretrain",
    "PretrainedError": f"{_TEXT}.base", "load_paddlenlp_base": f"{_TEXT}.base",
    "mask_predict": f"{__name__}.decode", "bleu": f"{__name__}.evaluate", "plot_losses": f"{__name__}.evaluate",
    "TrainConfig": f"{__name__}.trainconfig", "train_single": f"{__name__}.train", "ABNetRecipe": f"{__name__}.stages",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
