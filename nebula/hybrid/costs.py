"""Costs of a layered model's layers, measured on each rank itself, as `nebula.balance.LayerCost`s and profiles.

`time_layers` runs every layer of the model on one rank exactly as the pipeline runner does (the first layer loads
its inputs, the last computes the loss; forward and backward each stretched by the rank's simulated slowdown, the
optimizer step not), one warm-up round, then rounds until a wall-clock budget is spent (at least `min_rounds`), and
keeps each layer's median: a fixed budget bounds how long the other ranks wait for it, however loaded the host.
`costs_from_timings` turns every rank's timings into one list of layer costs and one speed per rank: a layer's
`flops` are FLOP-equivalents, its mean share of a rank's whole-model time times the model's analytic FLOPs, and a
rank's seconds per FLOP are its measured whole-model time over those FLOPs, so each rank's predicted time for all
layers is what it measured. `memory_bytes` counts weights, gradients and two Adam moments (4 copies of the
parameters) plus the activation the layer keeps for its backward on every micro-batch in flight;
`activation_bytes` is what crosses a cut after the layer per micro-batch: its output forward, its gradient back.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any, Sequence

import numpy as np

from nebula.hybrid.layered import LayeredModel, build_layers

__all__ = ["LayerTiming", "time_layers", "costs_from_timings", "analytic_layer_costs", "PARAM_COPIES"]

PARAM_COPIES = 4  # weight, gradient, Adam's two moments


def _nbytes(t: Any) -> int:
    return int(np.prod(t.shape)) * t.element_size()


@dataclass(frozen=True, slots=True)
class LayerTiming:
    """One layer on one rank: median seconds of its forward and backward on one micro-batch (slowdown included),
    of its optimizer step, and its bytes (parameters, input, output)."""

    forward_s: float
    backward_s: float
    optimizer_s: float
    param_bytes: int
    input_bytes: int
    output_bytes: int
    params: int

    def to_dict(self) -> dict:
        """Plain values (JSON, all_gather_object)."""
        return asdict(self)


def time_layers(model: LayeredModel, batch: int, *, seed: int = 0, slowdown: float = 1.0, budget_s: float = 2.0,
                min_rounds: int = 3, max_rounds: int = 50) -> list[LayerTiming]:
    """Time every layer of `model` on micro-batches of `batch` examples (ids 0..batch-1) on this rank."""
    import paddle

    from nebula.balance.simulate import Slowdown

    slow = Slowdown(compute=slowdown)
    layers = build_layers(model, 0, model.num_layers, seed)
    opts = [model.build_optimizer(list(layer.parameters())) for layer in layers]
    ids = np.arange(batch)
    last = model.num_layers - 1
    samples: list[list[tuple[float, float, float]]] = [[] for _ in layers]
    shapes: list[tuple[int, int]] = [(0, 0)] * len(layers)
    deadline = None
    rounds = 0
    while rounds < max_rounds + 1:
        x = None
        for i, layer in enumerate(layers):
            t0 = time.perf_counter()
            with slow.compute_block():  # what the runner times as one forward
                if i == 0:
                    xin = model.inputs(ids)
                else:
                    xin = x.detach()
                    xin.stop_gradient = False
                y = layer(xin)
                if i == last:
                    y = model.loss(y, model.targets(ids))
                    float(y.numpy())
            t1 = time.perf_counter()
            with slow.compute_block():
                if i == last:
                    y.backward()
                else:
                    y.backward(paddle.ones_like(y))
            t2 = time.perf_counter()
            opts[i].step()
            opts[i].clear_grad()
            t3 = time.perf_counter()
            if rounds:  # round 0 warms up (allocations, Adam's moments)
                samples[i].append((t1 - t0, t2 - t1, t3 - t2))
            shapes[i] = (_nbytes(xin), _nbytes(y) if i < last else 0)
            x = y
        rounds += 1
        if deadline is None:
            deadline = time.perf_counter() + budget_s
        elif rounds > min_rounds and time.perf_counter() >= deadline:
            break
    out = []
    for layer, s, (inp, outp) in zip(layers, samples, shapes):
        out.append(LayerTiming(statistics.median(a for a, _, _ in s), statistics.median(b for _, b, _ in s),
                               statistics.median(c for _, _, c in s), sum(_nbytes(p) for p in layer.parameters()),
                               inp, outp, sum(int(np.prod(p.shape)) for p in layer.parameters())))
    return out


def costs_from_timings(timings: Sequence[Sequence[LayerTiming]], batch: int, *, micro_batches: int = 1,
                       ) -> tuple[list, list[float]]:
    """(one LayerCost per layer, seconds per FLOP per rank) from every rank's `time_layers` (rank order)."""
    from nebula.balance import LayerCost

    if not timings or not timings[0]:
        raise ValueError("costs_from_timings needs the layer timings of at least one rank")
    num_layers = len(timings[0])
    totals = [sum(t.forward_s + t.backward_s for t in rank) for rank in timings]
    share = [statistics.fmean((rank[j].forward_s + rank[j].backward_s) / tot for rank, tot in zip(timings, totals))
             for j in range(num_layers)]
    flops = 6.0 * batch * sum(t.params for t in timings[0])  # forward 2, backward 4 per multiply-add weight
    if flops <= 0:
        flops = float(batch * num_layers)  # no weights: any positive unit will do
    costs = [LayerCost(share[j] * flops, PARAM_COPIES * t.param_bytes + micro_batches * t.input_bytes,
                       2 * t.output_bytes, f"layer{j}") for j, t in enumerate(timings[0])]
    return costs, [tot / flops for tot in totals]


def analytic_layer_costs(model: LayeredModel, batch: int, *, micro_batches: int = 1) -> list:
    """LayerCosts from shapes alone (the same on every machine): 6 x batch x parameters FLOPs per micro-batch
    (forward 2, backward 4 per multiply-add weight), bytes as in `costs_from_timings`."""
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
