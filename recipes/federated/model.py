"""The language-identification model: a bag of hashed character n-grams into a small MLP."""
from __future__ import annotations

import paddle
from paddle import nn

__all__ = ["LangIdModel"]


class LangIdModel(nn.Layer):
    """Linear(num_buckets -> hidden), ReLU, Linear(hidden -> num_langs)."""

    def __init__(self, num_buckets: int = 4096, hidden: int = 64, num_langs: int = 6, seed: int = 0) -> None:
        super().__init__()
        paddle.seed(seed)  # every client builds the same initial model
        self.hidden = nn.Linear(num_buckets, hidden)
        self.out = nn.Linear(hidden, num_langs)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        return self.out(nn.functional.relu(self.hidden(x)))
