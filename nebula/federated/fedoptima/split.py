"""FedOptima's pre-processor (§IV-A): profile a sequential model's layers and pick the split point.

For a split after layer l, device k needs t_train(k, l) = 3·Σ_{i≤l} O_i / σ_k per sample (forward plus the
backward pass, about twice the forward) and t_transfer(k, l) = S_l / b_k to upload that sample's activations,
with O_i the forward FLOPs and S_l the output bytes of layer i, σ_k the device's FLOP/s and b_k its bandwidth in
bytes/s. The paper's optimisation problem (its Eq. 8) chooses l to balance the two; here l minimises the
slowest device's t_train + t_transfer over l = 1 .. L-1 (every split leaves at least one layer on each side),
ties going to the smaller l so that more of the model trains centrally on the server.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

__all__ = ["LayerCostPerSample", "DeviceInfo", "profile_layers", "split_point", "check_split", "split_costs",
           "measure_flops_per_s"]


@dataclass(frozen=True, kw_only=True, slots=True)
class LayerCostPerSample:
    """One layer's forward FLOPs and output size per sample."""

    flops: float
    output_bytes: int


@dataclass(frozen=True, kw_only=True, slots=True)
class DeviceInfo:
    """What a device reports at initialisation: its FLOP/s and its upload bandwidth in bytes/s."""

    flops_per_s: float
    bandwidth_bytes_per_s: float

    def __post_init__(self) -> None:
        for name in ("flops_per_s", "bandwidth_bytes_per_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and np.isfinite(v) and v > 0):
                raise ValueError(f"device {name}={v!r} must be a positive number; measure it with the device "
                                 "benchmark or give it in the job file")


def _layer_flops(layer, x, y) -> float:
    """Forward FLOPs per sample of one leaf layer that read `x` and wrote `y`."""
    import paddle.nn as nn

    n = max(1, int(x.shape[0]))
    if isinstance(layer, nn.Linear):
        return 2.0 * float(np.prod(y.shape)) / n * layer.weight.shape[0]  # weight is [in, out]
    if isinstance(layer, (nn.Conv1D, nn.Conv2D, nn.Conv3D)):
        w = layer.weight.shape  # [out, in/groups, k...]
        return 2.0 * float(np.prod(y.shape)) / n * float(np.prod(w[1:]))
    params = sum(int(np.prod(p.shape)) for p in layer.parameters())
    return float(np.prod(y.shape)) / n + 2.0 * params


def _block_flops(layer, x):
    """(forward FLOPs per sample, output) of `layer`: the sum over the leaf layers it runs, so that a composite
    block (a bottleneck, an encoder layer) counts the convolutions and projections inside it."""
    leaves = [m for m in layer.sublayers(include_self=True) if not list(m.children())]
    total = [0.0]

    def count(leaf, inputs, output):
        if isinstance(output, (list, tuple)):
            output = output[0]
        total[0] += _layer_flops(leaf, inputs[0], output)

    hooks = [leaf.register_forward_post_hook(count) for leaf in leaves]
    try:
        y = layer(x)
    finally:
        for h in hooks:
            h.remove()
    return total[0], y


def profile_layers(layers: Sequence, sample) -> list[LayerCostPerSample]:
    """Forward FLOPs and output bytes per sample of each layer, by running `sample` (a batch) through them."""
    import paddle

    out = []
    x = sample
    with paddle.no_grad():
        for layer in layers:
            flops, y = _block_flops(layer, x)
            out.append(LayerCostPerSample(flops=flops, output_bytes=int(np.prod(y.shape[1:])) * y.element_size()))
            x = y
    return out


def check_split(split: int, num_layers: int) -> int:
    """`split` (layers kept on the device) if 1 <= split <= num_layers - 1, else ValueError naming the range."""
    if num_layers < 2:
        raise ValueError(f"the model has {num_layers} layer(s); FedOptima needs at least 2 to split between device "
                         "and server")
    if isinstance(split, bool) or not isinstance(split, (int, np.integer)) or not 1 <= split <= num_layers - 1:
        raise ValueError(f"split point {split!r} is outside the model: it must be between 1 and {num_layers - 1} "
                         f"(layers kept on the device, of {num_layers}); leave it unset to let the pre-processor "
                         "choose")
    return int(split)


def split_costs(profile: Sequence[LayerCostPerSample], devices: Sequence[DeviceInfo]) -> list[float]:
    """Slowest device's t_train + t_transfer per sample for each split l = 1 .. L-1 (index l-1)."""
    if not devices:
        raise ValueError("no device information; every device reports its FLOP/s and bandwidth first")
    flops = np.cumsum([p.flops for p in profile])
    costs = []
    for l in range(1, len(profile)):
        costs.append(max(3.0 * flops[l - 1] / d.flops_per_s + profile[l - 1].output_bytes / d.bandwidth_bytes_per_s
                         for d in devices))
    return costs


def split_point(profile: Sequence[LayerCostPerSample], devices: Sequence[DeviceInfo]) -> int:
    """The pre-processor's split point: layers 0 .. l-1 on the devices, the rest on the server."""
    check_split(1, len(profile))
    costs = split_costs(profile, devices)
    return int(np.argmin(costs)) + 1


def measure_flops_per_s(size: int = 256, repeats: int = 8, slowdown: float = 1.0) -> float:
    """This device's FLOP/s from timed Paddle matmuls (the best of `repeats`), divided by a simulated slowdown."""
    import time

    import paddle

    a = paddle.randn([size, size])
    b = paddle.randn([size, size])
    (a @ b).numpy()  # warm-up: kernel selection and allocation
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        (a @ b).numpy()
        best = min(best, time.perf_counter() - t0)
    return 2.0 * size**3 / max(best, 1e-9) / max(slowdown, 1.0)
