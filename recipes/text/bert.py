"""A BERT-style masked language model (embeddings, post-LN transformer layers, MLM head): the base that ABNet adapts,
ELECTRA's discriminator exports, and the pretraining of each recipe trains."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import paddle
import paddle.nn as nn
import paddle.nn.functional as F

from recipes.text.tokenizer import PAD_ID

__all__ = ["BertConfig", "BertModel", "padding_bias", "gather_rows", "NEG_BIAS"]

NEG_BIAS = -1e4  # additive attention bias for masked keys; finite so fully masked rows stay NaN-free


@dataclass(frozen=True, kw_only=True, slots=True)
class BertConfig:
    """Shape of one BERT-style base (a masked language model for one language)."""

    vocab_size: int = 1000
    hidden: int = 128
    num_layers: int = 2
    num_heads: int = 4
    ff_hidden: int = 512
    max_positions: int = 64
    dropout: float = 0.1

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden", "num_layers", "num_heads", "ff_hidden", "max_positions"):
            if getattr(self, name) < 1:
                raise ValueError(f"BertConfig.{name}={getattr(self, name)}: must be a positive integer")
        if self.hidden % self.num_heads:
            raise ValueError(f"BertConfig.hidden={self.hidden} is not divisible by num_heads={self.num_heads}; "
                             "pick a head count that divides the hidden size")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"BertConfig.dropout={self.dropout}: must be in [0, 1)")

    def to_dict(self) -> dict:
        """Plain dict for config.json."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def replace(self, **kw) -> "BertConfig":
        """Copy with some fields changed."""
        return dataclasses.replace(self, **kw)


def padding_bias(ids: paddle.Tensor) -> paddle.Tensor:
    """Additive attention bias [B, 1, 1, T]: 0 for tokens, -1e4 for PAD keys."""
    return ((ids == PAD_ID).astype("float32") * NEG_BIAS).unsqueeze([1, 2])


def gather_rows(x: paddle.Tensor, mask: paddle.Tensor) -> paddle.Tensor:
    """Rows of x [B, T, H] where mask [B, T] is true, as [N, H] (the vocabulary head then runs on N rows only)."""
    idx = paddle.nonzero(mask.flatten()).squeeze(-1)
    return paddle.gather(x.reshape([-1, x.shape[-1]]), idx)


class BertModel(nn.Layer):
    """A BERT-style masked language model: embeddings, post-LN transformer layers, MLM head (untied)."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.position_embeddings = nn.Embedding(cfg.max_positions, cfg.hidden)
        self.embed_norm = nn.LayerNorm(cfg.hidden)
        self.dropout = nn.Dropout(cfg.dropout)
        # Same parameter layout as PaddleNLP's BERT (nn.TransformerEncoderLayer, post-LN, GELU).
        self.layers = nn.LayerList([
            nn.TransformerEncoderLayer(cfg.hidden, cfg.num_heads, cfg.ff_hidden, dropout=cfg.dropout,
                                       activation="gelu", attn_dropout=cfg.dropout, act_dropout=0.0)
            for _ in range(cfg.num_layers)
        ])
        self.mlm_transform = nn.Linear(cfg.hidden, cfg.hidden)
        self.mlm_norm = nn.LayerNorm(cfg.hidden)
        self.mlm_decoder = nn.Linear(cfg.hidden, cfg.vocab_size)

    def embed(self, ids: paddle.Tensor) -> paddle.Tensor:
        """Token + position embeddings, normalised: [B, T, H]."""
        if ids.shape[1] > self.cfg.max_positions:
            raise ValueError(f"sequence length {ids.shape[1]} exceeds max_positions={self.cfg.max_positions}; "
                             "truncate inputs (max_len) or use a base with more positions")
        pos = paddle.arange(ids.shape[1], dtype="int64").unsqueeze(0)
        return self.dropout(self.embed_norm(self.word_embeddings(ids) + self.position_embeddings(pos)))

    def mlm_logits(self, hidden: paddle.Tensor) -> paddle.Tensor:
        """Vocabulary logits [B, T, V] from hidden states."""
        return self.mlm_decoder(self.mlm_norm(F.gelu(self.mlm_transform(hidden))))

    def forward(self, ids: paddle.Tensor) -> paddle.Tensor:
        """MLM logits of `ids` (used by pretraining)."""
        bias = padding_bias(ids)
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x, bias)
        return self.mlm_logits(x)

    def freeze(self, keep_output_layer: bool = False) -> None:
        """Stop gradients to every base parameter (optionally leaving the MLM head trainable)."""
        head = {id(p) for m in (self.mlm_transform, self.mlm_norm, self.mlm_decoder) for p in m.parameters()}
        for p in self.parameters():
            p.stop_gradient = not (keep_output_layer and id(p) in head)
