"""ABNet adapter fine-tuning across two clusters (Nebula-I Scenario II): data, tokenizers, model, training, decoding.

Public API: `prepare_data` (gettext catalogs -> per-cluster sides), `Tokenizer`/`train_tokenizer`, model classes and
presets (`preset("tiny"|"small"|"paper")`), `ensure_base`/`load_base`/`mlm_pretrain` (`load_base` also reads PaddleNLP
BERT / ERNIE-M checkpoints with their own tokenizers: `load_paddlenlp_base`), `mask_predict`, `bleu`,
`TrainConfig`, `train_single` and `ABNetRecipe` (the `nebula.pipeline` recipe: stages "encoder" and "decoder").
Heavy modules (Paddle) load on first use so `import recipes.abnet` stays cheap.
"""
from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "prepare_data", "DataConfig", "CatalogError", "Tokenizer", "train_tokenizer", "AbnetConfig", "BertConfig",
    "preset", "PRESETS", "AbnetEncoder", "AbnetDecoder", "ensure_base", "load_base", "mlm_pretrain",
    "PretrainedError", "load_paddlenlp_base", "mask_predict", "bleu", "plot_losses", "TrainConfig", "train_single", "ABNetRecipe",
]

_WHERE = {
    "prepare_data": "data", "DataConfig": "data", "CatalogError": "data",
    "Tokenizer": "tokenizer", "train_tokenizer": "tokenizer",
    "AbnetConfig": "model", "BertConfig": "model", "preset": "model", "PRESETS": "model",
    "AbnetEncoder": "model", "AbnetDecoder": "model",
    "ensure_base": "pretrain", "load_base": "pretrain", "mlm_pretrain": "pretrain", "PretrainedError": "pretrain",
    "load_paddlenlp_base": "checkpoint",
    "mask_predict": "decode", "bleu": "evaluate", "plot_losses": "evaluate",
    "TrainConfig": "trainconfig", "train_single": "train", "ABNetRecipe": "stages",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
