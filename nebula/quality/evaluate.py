"""Held-out loss of a causal LM built as Nebula's layers (`nebula.formers.CausalLMLayers`)."""
from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["build_full", "heldout_loss", "num_params"]


def build_full(layered: Any, seed: int) -> Any:
    """All layers of `layered` in one Sequential, seeded per layer as the runtime's stages build them."""
    import paddle

    from nebula.hybrid.layered import build_layers

    return paddle.nn.Sequential(*build_layers(layered, 0, layered.num_layers, seed))


def num_params(model: Any) -> int:
    """Number of trainable values in `model`."""
    return int(sum(int(np.prod(p.shape)) for p in model.parameters()))


def heldout_loss(model: Any, layered: Any, data: Any, *, batch: int = 32) -> float:
    """Mean next-token cross-entropy (nats per predicted token) of `model` over every example of `data` (a
    `nebula.formers.data.TokenData`), using `layered`'s loss; weighted by real tokens so batch size does not
    change it."""
    import paddle

    from nebula.formers.layers import IGNORE_INDEX

    total, count = 0.0, 0
    with paddle.no_grad():
        for start in range(0, data.num_examples, batch):
            ids = np.arange(start, min(start + batch, data.num_examples))
            labels = data.labels(ids)
            n = int((labels[:, 1:] != IGNORE_INDEX).sum())
            if n == 0:
                continue
            out = model(paddle.to_tensor(data.tokens(ids)))
            total += float(layered.loss(out, paddle.to_tensor(labels))) * n
            count += n
    if count == 0:
        raise ValueError("held-out data has no token to predict; give it non-empty lines")
    return total / count
