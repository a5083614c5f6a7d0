"""FedOptima's default auxiliary network (§IV-A): one layer of the kind of the last device layer, then a dense
classifier, so a device computes a local loss and never waits for gradients from the server."""
from __future__ import annotations

from typing import Sequence

__all__ = ["default_auxiliary", "last_parametric"]


def last_parametric(layers: Sequence):
    """The last layer in `layers` that has weights (activations and pooling have none): the kind to copy."""
    for layer in reversed(list(layers)):
        if list(layer.parameters()):
            return layer
    raise ValueError("the device-side layers have no layer with weights; put at least one Linear or Conv layer "
                     "before the split point")


def default_auxiliary(device_layers: Sequence, sample, num_classes: int):
    """nn.Sequential: a copy-kind of the last weighted device layer (same width), its activation, then Linear."""
    import paddle
    import paddle.nn as nn

    if not isinstance(num_classes, int) or num_classes < 2:
        raise ValueError(f"num_classes={num_classes!r} must be an integer >= 2 for the auxiliary classifier")
    layers = list(device_layers)
    last = last_parametric(layers)
    with paddle.no_grad():
        x = sample
        for layer in layers:
            x = layer(x)
    parts: list = []
    if isinstance(last, nn.Linear):
        width = int(x.shape[-1])
        parts += [nn.Linear(width, width), nn.ReLU()]
    elif isinstance(last, (nn.Conv1D, nn.Conv2D)):
        ch = int(x.shape[1])
        k = last._kernel_size
        conv = nn.Conv2D if isinstance(last, nn.Conv2D) else nn.Conv1D
        parts += [conv(ch, ch, k, padding="SAME"), nn.ReLU()]
    elif isinstance(last, nn.Embedding):
        pass  # a second embedding cannot read embeddings: the classifier reads them directly
    else:
        raise ValueError(f"no default auxiliary layer for a {type(last).__name__}; pass `auxiliary` (a Paddle "
                         "layer ending in a classifier) explicitly")
    head = nn.Sequential(*parts, nn.Flatten())
    with paddle.no_grad():
        features = int(head(x).shape[-1])
    return nn.Sequential(*parts, nn.Flatten(), nn.Linear(features, num_classes))
