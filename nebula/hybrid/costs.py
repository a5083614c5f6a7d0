"""Costs of a layered model's layers as `nebula.balance.LayerCost`, measured on the layers themselves.

A layer's `flops` here are FLOP-equivalents: its measured forward+backward seconds on one micro-batch divided by
the seconds per FLOP the device benchmark's probe measured in the same process. Small layers are dominated by
per-operator overhead that a FLOP count misses; dividing by the probe's rate keeps the allocation's unit (a device
with k times the probe's seconds per FLOP takes k times as long) while predicting what the layers really take.
`memory_bytes` counts weights, gradients and two Adam moments (4 copies of the parameters) plus the activation the
layer keeps for its backward on every micro-batch in flight; `activation_bytes` is what crosses a cut after the
layer per micro-batch: its output forward and the same-sized gradient back.
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from nebula.hybrid.layered import LayeredModel, build_layers

__all__ = ["layer_costs", "analytic_layer_costs", "pipeline_time_s", "PARAM_COPIES"]

PARAM_COPIES = 4  # weight, gradient, Adam's two moments


def _nbytes(t: Any) -> int:
    return int(np.prod(t.shape)) * t.element_size()


def layer_costs(model: LayeredModel, batch: int, *, seed: int = 0, time_per_flop_s: float | None = None,
                micro_batches: int = 1, warmup: int = 2, repeats: int = 10) -> list:
    """One LayerCost per layer for micro-batches of `batch` examples (ids 0..batch-1 as the probe input).

    `time_per_flop_s`: the probe's rate on this process (measured now when None)."""
    import paddle

    from nebula.balance import LayerCost
    from nebula.hybrid.probe import probe_compute

    if time_per_flop_s is None:
        s, f = probe_compute()
        time_per_flop_s = s / f
    layers = build_layers(model, 0, model.num_layers, seed)
    ids = np.arange(batch)
    x = model.inputs(ids)
    out = []
    for i, layer in enumerate(layers):
        xin = x.detach()
        xin.stop_gradient = i == 0
        times = []
        for r in range(warmup + repeats):
            t0 = time.perf_counter()
            if i == 0:  # the first stage loads its inputs too
                xin = model.inputs(ids)
            y = layer(xin)
            if i == model.num_layers - 1:
                model.loss(y, model.targets(ids)).backward()
            else:
                y.backward(paddle.ones_like(y))
            if r >= warmup:
                times.append(time.perf_counter() - t0)
            layer.clear_gradients()
        params = sum(_nbytes(p) for p in layer.parameters())
        act = _nbytes(y) if i < model.num_layers - 1 else 0
        seconds = float(np.median(times))  # median, like the probe it is divided by
        out.append(LayerCost(seconds / time_per_flop_s, PARAM_COPIES * params + micro_batches * _nbytes(xin),
                             2 * act, f"layer{i}"))
        x = y.detach()
    return out


def analytic_layer_costs(model: LayeredModel, batch: int, *, micro_batches: int = 1) -> list:
    """LayerCosts from shapes alone (the same on every machine): 6 x batch x parameters FLOPs per micro-batch
    (forward 2, backward 4 per multiply-add weight), bytes as in `layer_costs`."""
    import paddle

    from nebula.balance import LayerCost

    layers = build_layers(model, 0, model.num_layers, 0)
    x = model.inputs(np.arange(batch))
    out = []
    with paddle.no_grad():
        for i, layer in enumerate(layers):
            params = sum(int(np.prod(p.shape)) for p in layer.parameters())
            pbytes = sum(_nbytes(p) for p in layer.parameters())
            y = layer(x)
            act = _nbytes(y) if i < model.num_layers - 1 else 0
            out.append(LayerCost(6.0 * batch * params, PARAM_COPIES * pbytes + micro_batches * _nbytes(x), 2 * act,
                                 f"layer{i}"))
            x = y
    return out


def pipeline_time_s(stage_times_s: list[float], micro_batches: int) -> float:
    """Predicted iteration time of a fill-and-drain (GPipe) schedule from per-micro-batch stage times.

    The first micro-batch crosses every stage, the other M-1 follow at the pace of the slowest stage: forward
    and backward each take sum(f) + (M-1) max(f) when every stage's backward is a fixed multiple of its forward."""
    if not stage_times_s or micro_batches < 1:
        raise ValueError("pipeline_time_s needs stage times and micro_batches >= 1")
    return float(sum(stage_times_s) + (micro_batches - 1) * max(stage_times_s))
