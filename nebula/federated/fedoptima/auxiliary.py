"""FedOptima's default auxiliary network (§IV-A): one layer of the kind of the last device layer, then a dense
classifier, so a device computes a local loss and never waits for gradients from the server.

A composite last layer (a bottleneck block, an encoder layer) is copied when it maps its own output's shape to
itself; one that changes the shape (a strided block, a block that widens) cannot read its own output, so the kind
of its last Linear or Conv leaf stands in for it. Convolutional features are averaged over their positions before
the dense classifier (the paper leaves the classifier's input open): the auxiliary network is sent with the
device model every round, and this keeps it a few kilobytes.
"""
from __future__ import annotations

import copy

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
    """nn.Sequential: a layer of the kind of the last weighted device layer (same width) and its activation, an
    average over positions for feature maps, then Linear to the classes."""
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
    composite = bool(list(last.children()))
    leaf = last if not composite else next(
        (m for m in reversed(last.sublayers()) if isinstance(m, (nn.Linear, nn.Conv1D, nn.Conv2D))), last)
    block = _shape_keeping_copy(last, x) if composite else None
    parts: list = []
    if block is not None:
        parts.append(block)
    elif isinstance(leaf, nn.Linear):
        width = int(x.shape[-1])
        parts += [nn.Linear(width, width), nn.ReLU()]
    elif isinstance(leaf, (nn.Conv1D, nn.Conv2D)):
        ch = int(x.shape[1])
        conv = nn.Conv2D if isinstance(leaf, nn.Conv2D) else nn.Conv1D
        parts += [conv(ch, ch, leaf._kernel_size, padding="SAME"), nn.ReLU()]
    elif isinstance(leaf, nn.Embedding):
        pass  # a second embedding cannot read embeddings: the classifier reads them directly
    else:
        raise ValueError(f"no default auxiliary layer for a {type(last).__name__}; pass `auxiliary` (a Paddle "
                         "layer ending in a classifier) explicitly")
    if isinstance(leaf, (nn.Conv1D, nn.Conv2D)):
        # feature maps are averaged over their positions before the classifier, as a CNN's own head does: the
        # auxiliary network travels with the device model every round, and a dense layer over a flattened early
        # feature map would be most of those bytes (1.2 M weights for MobileNetV3's 24x16x16 maps, 200 classes)
        parts.append(nn.AdaptiveAvgPool2D(1) if isinstance(leaf, nn.Conv2D) else nn.AdaptiveAvgPool1D(1))
    head = nn.Sequential(*parts, nn.Flatten())
    with paddle.no_grad():
        features = int(head(x).shape[-1])
    return nn.Sequential(*parts, nn.Flatten(), nn.Linear(features, num_classes))


def _shape_keeping_copy(block, x):
    """A copy of `block` if it reads a tensor of x's shape and returns the same shape, else None. The copy starts
    from the block's weights as they are when the network is built, that is from its initialisation."""
    import paddle

    twin = copy.deepcopy(block)
    try:
        with paddle.no_grad():
            y = twin(x)
    except (ValueError, RuntimeError):  # Paddle's shape errors: the block needs an input of another shape
        return None
    if isinstance(y, (list, tuple)) or list(y.shape) != list(x.shape):
        return None
    return twin
