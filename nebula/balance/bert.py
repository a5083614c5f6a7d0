"""BERT-style models for allocation: analytic per-layer costs at any size, and the same layers as real Paddle modules.

The model is the paper's split (§VI-B, Figure 8): embedding, N encoder layers, pooler, classification head, one
allocation unit each. Analytic costs (for one iteration of `batch` sequences of `seq_len` tokens, t = batch x seq_len):

- FLOPs: forward matmuls 2 x t x (4h^2 + 2hi) plus attention 4 x batch x seq_len^2 x h per encoder layer; the
  pooler 2 x batch x h^2, the head 2 x batch x h x classes, the embedding 8 x t x h (sums and LayerNorm); a training
  iteration is forward plus backward, counted as 3x the forward (backward is about twice the forward).
- memory: parameters and gradients in the dtype, optimizer state `optimizer_states` fp32 copies per parameter
  (2 for Adam), plus the activations kept for backward: per encoder layer t x h x (34 + 5 x heads x seq_len / h)
  bytes at 16 bits (Korthikanti et al. 2022, "Reducing Activation Recomputation"), scaled to the dtype.
- activation_bytes: the layer's output, t x h x dtype (batch x h for the pooler, batch x classes for the head).

`bert_layers` makes real Paddle layers of the same structure (small sizes) for `nebula.balance.profile`.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from nebula.balance.cost import LayerCost

__all__ = ["BertShape", "PRESETS", "bert_costs", "preset", "bert_layers", "example_input"]

_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}


@dataclass(frozen=True, kw_only=True, slots=True)
class BertShape:
    """Sizes of a BERT-style classifier and one training iteration (defaults: BERT-Large, batch 32 as the paper)."""

    num_layers: int
    hidden: int = 1024
    heads: int = 16
    intermediate: int = 4096
    vocab: int = 30522
    max_positions: int = 512
    seq_len: int = 128
    batch: int = 32
    num_classes: int = 3  # MNLI: entailment, neutral, contradiction
    dtype: str = "float32"
    optimizer_states: int = 2  # fp32 values kept per parameter by the optimizer (Adam: 2)

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden", "heads", "intermediate", "vocab", "max_positions", "seq_len", "batch",
                     "num_classes"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"BertShape.{name}={v!r} must be an integer >= 1")
        if self.hidden % self.heads:
            raise ValueError(f"BertShape.hidden={self.hidden} is not divisible by heads={self.heads}; pick a head "
                             "count that divides the hidden size")
        if self.dtype not in _DTYPE_BYTES:
            raise ValueError(f"BertShape.dtype={self.dtype!r} is not one of {', '.join(_DTYPE_BYTES)}")
        if self.seq_len > self.max_positions:
            raise ValueError(f"BertShape.seq_len={self.seq_len} exceeds max_positions={self.max_positions}")
        if self.optimizer_states < 0:
            raise ValueError(f"BertShape.optimizer_states={self.optimizer_states} must be >= 0 (SGD: 0, Adam: 2)")

    @property
    def dtype_bytes(self) -> int:
        """Bytes per value of the dtype in use."""
        return _DTYPE_BYTES[self.dtype]


def _layer(name: str, fwd_flops: float, params: int, saved: float, out: float, shape: BertShape) -> LayerCost:
    state = params * (2 * shape.dtype_bytes + 4 * shape.optimizer_states)  # weights, grads, optimizer state
    return LayerCost(3.0 * fwd_flops, float(state + saved), float(out), name=name)


def bert_costs(shape: BertShape) -> list[LayerCost]:
    """Analytic LayerCost of embedding, each encoder layer, pooler and head (see the module docstring)."""
    h, i, s, b, a, db = shape.hidden, shape.intermediate, shape.seq_len, shape.batch, shape.heads, shape.dtype_bytes
    t = b * s
    emb_params = (shape.vocab + shape.max_positions + 2) * h + 2 * h
    layers = [_layer("embedding", 8.0 * t * h, emb_params, 4.0 * t * h * db, t * h * db, shape)]
    enc_params = 4 * h * h + 4 * h + 2 * h * i + i + h + 4 * h
    enc_fwd = 2.0 * t * (4 * h * h + 2 * h * i) + 4.0 * b * s * s * h
    enc_saved = t * h * (34 + 5 * a * s / h) * db / 2
    for k in range(shape.num_layers):
        layers.append(_layer(f"encoder{k}", enc_fwd, enc_params, enc_saved, t * h * db, shape))
    layers.append(_layer("pooler", 2.0 * b * h * h, h * h + h, 2.0 * b * h * db, b * h * db, shape))
    c = shape.num_classes
    layers.append(_layer("head", 2.0 * b * h * c, h * c + c, b * c * db, b * c * db, shape))
    return layers


PRESETS: dict[str, BertShape] = {
    "bert-40": BertShape(num_layers=40),
    "bert-80": BertShape(num_layers=80),
    "bert-160": BertShape(num_layers=160),
    "bert-base": BertShape(num_layers=12, hidden=768, heads=12, intermediate=3072),
    "bert-large": BertShape(num_layers=24),
    # the ABNet recipe's encoder sizes (recipes/abnet/model.py) and a tiny one for tests and the toy job
    "abnet-small": BertShape(num_layers=4, hidden=256, heads=4, intermediate=1024, vocab=1000, max_positions=64,
                             seq_len=64, batch=16),
    "abnet-base": BertShape(num_layers=12, hidden=768, heads=12, intermediate=3072, seq_len=64, batch=16),
    "toy": BertShape(num_layers=6, hidden=32, heads=2, intermediate=64, vocab=100, max_positions=16, seq_len=16,
                     batch=8),
}


def preset(name: str, **changes) -> BertShape:
    """The named BertShape (optionally with fields changed); ValueError naming the known presets."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; known: {', '.join(PRESETS)} (or pass a profile file)")
    return replace(PRESETS[name], **changes) if changes else PRESETS[name]


def bert_layers(shape: BertShape) -> list:
    """Real Paddle layers of `shape` in model order (embedding, encoders, pooler, head), for profiling."""
    import paddle
    from paddle import nn

    class Embedding(nn.Layer):
        """Word plus position embeddings, then LayerNorm: ids [batch, seq] -> [batch, seq, hidden]."""

        def __init__(self) -> None:
            super().__init__()
            self.word = nn.Embedding(shape.vocab, shape.hidden)
            self.position = nn.Embedding(shape.max_positions, shape.hidden)
            self.norm = nn.LayerNorm(shape.hidden)

        def forward(self, ids):
            pos = paddle.arange(ids.shape[1], dtype="int64").unsqueeze(0)
            return self.norm(self.word(ids) + self.position(pos))

    class Pooler(nn.Layer):
        """tanh(Linear) of the first token: [batch, seq, hidden] -> [batch, hidden]."""

        def __init__(self) -> None:
            super().__init__()
            self.dense = nn.Linear(shape.hidden, shape.hidden)

        def forward(self, x):
            return paddle.tanh(self.dense(x[:, 0]))

    layers = [Embedding()]
    for _ in range(shape.num_layers):
        layers.append(nn.TransformerEncoderLayer(shape.hidden, shape.heads, shape.intermediate, dropout=0.0))
    layers += [Pooler(), nn.Linear(shape.hidden, shape.num_classes)]
    if shape.dtype != "float32":
        for layer in layers:
            layer.to(dtype=shape.dtype)
    return layers


def example_input(shape: BertShape, seed: int = 0):
    """A batch of token ids [batch, seq_len] for `bert_layers`."""
    import numpy as np
    import paddle

    rng = np.random.default_rng(seed)
    return paddle.to_tensor(rng.integers(0, shape.vocab, size=(shape.batch, shape.seq_len)).astype("int64"))
