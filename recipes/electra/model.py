"""ELECTRA-style generator and discriminator (embeddings not shared), presets, masking, sampling and the three losses.

The generator is a small masked LM; the discriminator a larger encoder with two heads: replaced-token detection
(RTD, one logit per position) and corrective language modelling (CLM, the original token at every position,
COCO-LM style; it is the encoder's MLM head, so the discriminator exports as an ABNet base). Both are
`recipes.text.bert.BertModel` bodies (post-LN Transformer encoders, GeLU). Only token ids cross the WAN: the
generator sends the corrupted ids and, per position, the original id where it replaced one (0 elsewhere).
Masking and the sampling noise are pure functions of (seed, example id), so every run draws the same corruption.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import paddle
import paddle.nn as nn
import paddle.nn.functional as F

from recipes.text.bert import BertConfig, BertModel, padding_bias
from recipes.text.tokenizer import CLS_ID, MASK_ID, NUM_SPECIAL, PAD_ID

__all__ = ["ElectraPreset", "PRESETS", "preset", "Generator", "Discriminator", "mask_positions", "gumbel_sample",
           "corrupt", "pack", "unpack", "mlm_loss", "rtd_loss", "clm_loss", "encode"]


@dataclass(frozen=True, kw_only=True, slots=True)
class ElectraPreset:
    """Sizes of the generator and the discriminator (vocabulary and positions come from the data)."""

    generator: BertConfig
    discriminator: BertConfig


PRESETS: dict[str, ElectraPreset] = {
    # the discriminator of tiny/small has the shape of ABNet's tiny/small base, so it loads there as encoder base
    "tiny": ElectraPreset(
        generator=BertConfig(hidden=32, num_layers=1, num_heads=2, ff_hidden=128, max_positions=64, dropout=0.0),
        discriminator=BertConfig(hidden=64, num_layers=2, num_heads=2, ff_hidden=256, max_positions=64, dropout=0.0)),
    "small": ElectraPreset(
        generator=BertConfig(hidden=128, num_layers=2, num_heads=2, ff_hidden=512, max_positions=128),
        discriminator=BertConfig(hidden=256, num_layers=4, num_heads=4, ff_hidden=1024, max_positions=128)),
    # Nebula-I §4.1: generator 12 x 768 x 12, discriminator 24 x 1024 x 16, GeLU
    "paper": ElectraPreset(
        generator=BertConfig(hidden=768, num_layers=12, num_heads=12, ff_hidden=3072, max_positions=512),
        discriminator=BertConfig(hidden=1024, num_layers=24, num_heads=16, ff_hidden=4096, max_positions=512)),
}


def preset(name: str) -> ElectraPreset:
    """Named preset: tiny (default, minutes on 2 CPU cores), small, paper."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown ELECTRA preset {name!r}; choose one of {sorted(PRESETS)}") from None


def encode(body: BertModel, ids: paddle.Tensor) -> paddle.Tensor:
    """Hidden states [B, T, H] of `ids` (PAD keys masked out)."""
    bias = padding_bias(ids)
    x = body.embed(ids)
    for layer in body.layers:
        x = layer(x, bias)
    return x


class Generator(nn.Layer):
    """The masked LM that proposes replacements (its own embeddings)."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.body = BertModel(cfg)

    def forward(self, ids: paddle.Tensor, mask: paddle.Tensor) -> paddle.Tensor:
        """Vocabulary logits [n, V] at the masked positions (`mask` [B, T] bool)."""
        x = encode(self.body, ids)
        return self.body.mlm_logits(paddle.masked_select(x, mask.unsqueeze(-1)).reshape([-1, x.shape[-1]]))


class Discriminator(nn.Layer):
    """The encoder that is kept: RTD head (one logit per position) and CLM head (the body's MLM head)."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.electra = BertModel(cfg)  # "electra." prefix: ABNet's loader maps these names to its BertModel
        self.rtd_transform = nn.Linear(cfg.hidden, cfg.hidden)
        self.rtd_out = nn.Linear(cfg.hidden, 1)

    def forward(self, ids: paddle.Tensor, valid: paddle.Tensor) -> tuple[paddle.Tensor, paddle.Tensor]:
        """(RTD logits [B, T], CLM vocabulary logits [n, V] at the `valid` positions, in row-major order)."""
        x = encode(self.electra, ids)
        rtd = self.rtd_out(F.gelu(self.rtd_transform(x))).squeeze(-1)
        rows = paddle.masked_select(x, valid.unsqueeze(-1)).reshape([-1, x.shape[-1]])
        return rtd, self.electra.mlm_logits(rows)


def mask_positions(ids: np.ndarray, rng: np.random.Generator, rate: float) -> np.ndarray:
    """Bool [T] of one row's positions to mask: each real token (not PAD/[CLS]) with probability `rate`, at least
    one; over a TRTD pair the positions are uniform over both languages."""
    real = (ids != PAD_ID) & (ids != CLS_ID)
    m = (rng.random(ids.shape) < rate) & real
    if not m.any() and real.any():
        m[rng.choice(np.flatnonzero(real))] = True
    return m


def gumbel_sample(logits: np.ndarray, uniform: np.ndarray) -> np.ndarray:
    """Sample one token per row of `logits` [n, V] with Gumbel-max on noise `uniform` [n, V] in (0, 1); special
    tokens are never proposed."""
    g = logits.astype(np.float64) - np.log(-np.log(np.clip(uniform, 1e-12, 1 - 1e-12)))
    g[:, :NUM_SPECIAL] = -np.inf
    return g.argmax(axis=1)


def corrupt(ids: np.ndarray, mask: np.ndarray, sampled: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(corrupted ids, replaced) : masked positions take the samples; replaced = position differs from the original
    (a sample equal to the original counts as original, as in ELECTRA)."""
    out = ids.copy()
    out[mask] = sampled
    return out, out != ids


def pack(lang: np.ndarray, task: np.ndarray, corrupted: np.ndarray, original: np.ndarray,
         replaced: np.ndarray, vocab_size: int) -> np.ndarray:
    """What crosses the WAN, token ids only: [B, 2 + 2T] = language, task, corrupted ids, original id where
    replaced (0 elsewhere); int16 when the vocabulary fits, else int32."""
    dtype = np.int16 if vocab_size <= np.iinfo(np.int16).max else np.int32
    labels = np.where(replaced, original, 0)
    return np.concatenate([lang[:, None], task[:, None], corrupted, labels], axis=1).astype(dtype)


def unpack(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Inverse of `pack`: (lang, task, corrupted, replaced, original) as int64/bool arrays."""
    x = np.asarray(x).astype(np.int64)
    t = (x.shape[1] - 2) // 2
    lang, task, corrupted, labels = x[:, 0], x[:, 1], x[:, 2:2 + t], x[:, 2 + t:]
    replaced = labels != 0
    return lang, task, corrupted, replaced, np.where(replaced, labels, corrupted)


def mlm_loss(logits: paddle.Tensor, targets: paddle.Tensor) -> paddle.Tensor:
    """Generator loss: mean cross-entropy of the original tokens at the masked positions."""
    return F.cross_entropy(logits, targets.reshape([-1, 1]))


def rtd_loss(logits: paddle.Tensor, replaced: paddle.Tensor, valid: paddle.Tensor) -> paddle.Tensor:
    """Replaced-token detection: binary cross-entropy per position, mean over valid (non-PAD) positions."""
    valid_f = valid.astype("float32")
    per = F.binary_cross_entropy_with_logits(logits, replaced.astype("float32"), reduction="none")
    return (per * valid_f).sum() / valid_f.sum().clip(min=1.0)


def clm_loss(logits: paddle.Tensor, original: paddle.Tensor) -> paddle.Tensor:
    """Corrective LM: mean cross-entropy of the original token at every valid position (rows already selected)."""
    return F.cross_entropy(logits, original.reshape([-1, 1]))
