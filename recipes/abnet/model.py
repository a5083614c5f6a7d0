"""ABNet in Paddle: frozen BERT-style bases for each language plus trainable adapters, CMLM decoder, length predictor."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import paddle
import paddle.nn as nn
import paddle.nn.functional as F

from recipes.text.bert import NEG_BIAS, BertConfig, BertModel, gather_rows, padding_bias
from recipes.text.tokenizer import MASK_ID, PAD_ID

__all__ = [
    "BertConfig",
    "AbnetConfig",
    "PRESETS",
    "preset",
    "BertModel",
    "EncoderAdapter",
    "DecoderAdapter",
    "AbnetEncoder",
    "AbnetDecoder",
    "padding_bias",
    "source_keep_mask",
    "cmlm_mask",
    "cmlm_loss",
    "CmlmObjective",
    "gather_rows",
]

@dataclass(frozen=True, kw_only=True, slots=True)
class AbnetConfig:
    """Both bases and the adapters: encoder adapters (LN + FF + act + FF), decoder adapters (cross-attn + FF + LN)."""

    source: BertConfig = BertConfig()
    target: BertConfig = BertConfig()
    encoder_adapter_hidden: int = 256  # paper: 512
    decoder_adapter_hidden: int = 256  # paper: 768 (BERT-base hidden)
    decoder_adapter_heads: int = 4
    max_target_len: int = 32
    adapter_dropout: float = 0.1
    train_output_layer: bool = True  # the target MLM head adapts to the task; the bases stay frozen
    length_loss_weight: float = 0.1
    label_smoothing: float = 0.1
    # Soft copy (Gu et al., 2018): decoder inputs also get the encoder row at the proportional source position,
    # through a trainable projection. Not in ABNet; off in the paper preset, on in the small presets, where it
    # lets adapters on weak, briefly pretrained bases learn a translation within minutes.
    soft_copy: bool = False

    def __post_init__(self) -> None:
        if self.encoder_adapter_hidden < 1 or self.decoder_adapter_hidden < 1:
            raise ValueError("adapter hidden sizes must be positive integers")
        if self.target.hidden % self.decoder_adapter_heads:
            raise ValueError(f"decoder_adapter_heads={self.decoder_adapter_heads} must divide target.hidden="
                             f"{self.target.hidden}")
        if not 1 <= self.max_target_len <= self.target.max_positions:
            raise ValueError(f"max_target_len={self.max_target_len}: must be in [1, target.max_positions="
                             f"{self.target.max_positions}]")

    def with_vocab(self, source_vocab: int, target_vocab: int) -> "AbnetConfig":
        """Copy whose bases use the given tokenizer vocabulary sizes."""
        return dataclasses.replace(self, source=self.source.replace(vocab_size=source_vocab),
                                   target=self.target.replace(vocab_size=target_vocab))


_TINY = BertConfig(hidden=64, num_layers=2, num_heads=2, ff_hidden=256, max_positions=32)
_SMALL = BertConfig(hidden=256, num_layers=4, num_heads=4, ff_hidden=1024, max_positions=64)
_BASE = BertConfig(vocab_size=30522, hidden=768, num_layers=12, num_heads=12, ff_hidden=3072, max_positions=512)
PRESETS: dict[str, AbnetConfig] = {
    "tiny": AbnetConfig(source=_TINY, target=_TINY, encoder_adapter_hidden=128, decoder_adapter_hidden=128,
                        decoder_adapter_heads=2, max_target_len=24, soft_copy=True),
    "small": AbnetConfig(source=_SMALL, target=_SMALL, encoder_adapter_hidden=512, decoder_adapter_hidden=256,
                         decoder_adapter_heads=4, max_target_len=48, soft_copy=True),
    # Nebula-I §4.2: BERT-base sized bases, encoder adapters 512 wide, decoder adapters 768 wide, max length 64.
    "paper": AbnetConfig(source=_BASE.replace(vocab_size=119547), target=_BASE, encoder_adapter_hidden=512,
                         decoder_adapter_hidden=768, decoder_adapter_heads=12, max_target_len=64,
                         train_output_layer=False),
}


def preset(name: str) -> AbnetConfig:
    """Named model size: tiny (default, trains on 2 CPU cores), small, paper (BERT-base bases)."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown ABNet preset {name!r}; choose one of {sorted(PRESETS)}") from None


def source_keep_mask(h: paddle.Tensor) -> paddle.Tensor:
    """[B, S] float mask of real source positions, read from the encoder output itself.

    The encoder zeroes padded rows; every codec keeps an all-zero row (near) zero, while real rows leave a layer
    norm with norm ~sqrt(hidden), so a relative threshold recovers the mask without sending it separately."""
    norms = paddle.linalg.norm(h.astype("float32"), axis=-1)
    return (norms > 1e-3 * norms.max(axis=1, keepdim=True).clip(min=1e-6)).astype("float32")


class EncoderAdapter(nn.Layer):
    """ABNet encoder adapter: layer norm, FF up, GELU, FF down, residual."""

    def __init__(self, hidden: int, adapter_hidden: int, dropout: float) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.up = nn.Linear(hidden, adapter_hidden)
        self.down = nn.Linear(adapter_hidden, hidden)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        """x + FF(GELU(FF(LN(x))))."""
        return x + self.dropout(self.down(F.gelu(self.up(self.norm(x)))))


class DecoderAdapter(nn.Layer):
    """ABNet decoder adapter: multi-head cross-attention to the source, feed-forward, layer norms, residuals."""

    def __init__(self, hidden: int, source_hidden: int, adapter_hidden: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.cross = nn.MultiHeadAttention(hidden, heads, dropout=dropout, kdim=source_hidden, vdim=source_hidden)
        self.norm1 = nn.LayerNorm(hidden)
        self.ff1 = nn.Linear(hidden, adapter_hidden)
        self.ff2 = nn.Linear(adapter_hidden, hidden)
        self.norm2 = nn.LayerNorm(hidden)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: paddle.Tensor, src: paddle.Tensor, src_bias: paddle.Tensor) -> paddle.Tensor:
        """LN(x + CrossAttn(x, src)), then LN(y + FF(y))."""
        y = self.norm1(x + self.dropout(self.cross(x, src, src, src_bias)))
        return self.norm2(y + self.dropout(self.ff2(F.gelu(self.ff1(y)))))


class AbnetEncoder(nn.Layer):
    """Source side (cluster A): frozen source base, an adapter after every layer; output rows of PAD are zero."""

    def __init__(self, cfg: AbnetConfig, base: BertModel | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.base = base if base is not None else BertModel(cfg.source)
        self.base.freeze()
        self.adapters = nn.LayerList([
            EncoderAdapter(cfg.source.hidden, cfg.encoder_adapter_hidden, cfg.adapter_dropout)
            for _ in range(cfg.source.num_layers)
        ])

    def forward(self, src_ids: paddle.Tensor) -> paddle.Tensor:
        """[B, S] ids -> [B, S, H_src] representation, padded rows zeroed (the decoder reads the mask from them)."""
        bias = padding_bias(src_ids)
        x = self.base.embed(src_ids)
        for layer, adapter in zip(self.base.layers, self.adapters):
            x = adapter(layer(x, bias))
        return x * (src_ids != PAD_ID).astype(x.dtype).unsqueeze(-1)


class AbnetDecoder(nn.Layer):
    """Target side (cluster B): frozen target base, cross-attention adapters, CMLM head and length predictor."""

    def __init__(self, cfg: AbnetConfig, base: BertModel | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.base = base if base is not None else BertModel(cfg.target)
        self.base.freeze(keep_output_layer=cfg.train_output_layer)
        self.adapters = nn.LayerList([
            DecoderAdapter(cfg.target.hidden, cfg.source.hidden, cfg.decoder_adapter_hidden,
                           cfg.decoder_adapter_heads, cfg.adapter_dropout)
            for _ in range(cfg.target.num_layers)
        ])
        # The length predictor lives here because only this cluster sees target lengths.
        self.length_proj = nn.Linear(cfg.source.hidden, cfg.max_target_len + 1)
        self.copy_proj = nn.Linear(cfg.source.hidden, cfg.target.hidden) if cfg.soft_copy else None

    def soft_copy(self, h: paddle.Tensor, keep: paddle.Tensor, tgt_in: paddle.Tensor) -> paddle.Tensor:
        """Encoder rows at proportional positions: target j of length T reads source floor(j * S / T)."""
        src_len = keep.sum(axis=1, keepdim=True)
        tgt_len = (tgt_in != PAD_ID).astype("float32").sum(axis=1, keepdim=True).clip(min=1.0)
        pos = paddle.arange(tgt_in.shape[1], dtype="float32").unsqueeze(0)
        idx = paddle.minimum((pos * src_len / tgt_len).floor(), (src_len - 1).clip(min=0.0)).astype("int64")
        idx = idx.unsqueeze(-1).expand([tgt_in.shape[0], tgt_in.shape[1], h.shape[-1]])
        return self.copy_proj(paddle.take_along_axis(h, idx, axis=1))

    def predict_length(self, h: paddle.Tensor, keep: paddle.Tensor) -> paddle.Tensor:
        """Length logits [B, max_target_len + 1] from the mean of the real source rows."""
        pooled = (h * keep.unsqueeze(-1)).sum(axis=1) / keep.sum(axis=1, keepdim=True).clip(min=1.0)
        return self.length_proj(pooled)

    def hidden(self, h: paddle.Tensor, tgt_in: paddle.Tensor) -> tuple[paddle.Tensor, paddle.Tensor]:
        """(last hidden states [B, T, H_tgt], length logits [B, max_target_len + 1]) for a partly masked target."""
        h = h.astype("float32")
        keep = source_keep_mask(h)
        src_bias = ((1.0 - keep) * NEG_BIAS).unsqueeze([1, 2])
        bias = padding_bias(tgt_in)
        x = self.base.embed(tgt_in)
        if self.copy_proj is not None:
            x = x + self.soft_copy(h, keep, tgt_in)
        for layer, adapter in zip(self.base.layers, self.adapters):
            x = adapter(layer(x, bias), h, src_bias)
        return x, self.predict_length(h, keep)

    def forward(self, h: paddle.Tensor, tgt_in: paddle.Tensor) -> tuple[paddle.Tensor, paddle.Tensor]:
        """(token logits [B, T, V], length logits) for a partly masked target."""
        x, len_logits = self.hidden(h, tgt_in)
        return self.base.mlm_logits(x), len_logits


class CmlmObjective(nn.Layer):
    """Training wrapper: masks the target, runs the decoder, returns the CMLM loss (what data parallelism wraps)."""

    def __init__(self, decoder: AbnetDecoder) -> None:
        super().__init__()
        self.decoder = decoder

    def forward(self, h: paddle.Tensor, tgt: paddle.Tensor) -> paddle.Tensor:
        """Scalar loss: label-smoothed CE over the masked tokens + weighted length CE."""
        tgt_in, masked = cmlm_mask(tgt)
        x, len_logits = self.decoder.hidden(h, tgt_in)
        return cmlm_loss(self.decoder, x, len_logits, tgt, masked)


def cmlm_mask(tgt: paddle.Tensor, generator_seed: int | None = None) -> tuple[paddle.Tensor, paddle.Tensor]:
    """Conditional-MLM input: per sentence mask a uniform number 1..len of its tokens -> (tgt_in, masked bool)."""
    real = tgt != PAD_ID
    lengths = real.astype("int64").sum(axis=1, keepdim=True)
    if generator_seed is not None:
        paddle.seed(generator_seed)
    score = paddle.rand(tgt.shape)
    score = paddle.where(real, score, paddle.full_like(score, 2.0))
    # rank of each position's random score inside its sentence; masking the n lowest ranks picks n at random
    ranks = paddle.argsort(paddle.argsort(score, axis=1), axis=1)
    num_mask = (paddle.rand([tgt.shape[0], 1]) * lengths.astype("float32")).floor().astype("int64") + 1
    masked = (ranks < num_mask) & real
    return paddle.where(masked, paddle.full_like(tgt, MASK_ID), tgt), masked


def cmlm_loss(decoder: AbnetDecoder, hidden: paddle.Tensor, len_logits: paddle.Tensor, tgt: paddle.Tensor,
              masked: paddle.Tensor) -> paddle.Tensor:
    """Label-smoothed CE over the masked positions + weighted length CE (a scalar)."""
    cfg = decoder.cfg
    logits = decoder.base.mlm_logits(gather_rows(hidden, masked))
    labels = paddle.masked_select(tgt, masked).unsqueeze(-1)
    # F.cross_entropy is fused; log_softmax on CPU Paddle is two orders of magnitude slower.
    nll = F.cross_entropy(logits, labels)
    smooth = (paddle.logsumexp(logits, axis=-1) - logits.mean(axis=-1)).mean()  # CE against the uniform distribution
    token_loss = (1.0 - cfg.label_smoothing) * nll + cfg.label_smoothing * smooth
    lengths = (tgt != PAD_ID).astype("int64").sum(axis=1).clip(max=cfg.max_target_len)
    length_loss = F.cross_entropy(len_logits, lengths.unsqueeze(-1))
    return token_loss + cfg.length_loss_weight * length_loss
