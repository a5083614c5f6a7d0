"""Costs of a layered model's layers, measured on each rank itself, as `nebula.balance.LayerCost`s and profiles.

`LayerTimer` runs every layer of the model on one rank exactly as the pipeline runner does (the first layer loads
its inputs, the last computes the loss; forward and backward each stretched by the rank's simulated slowdown, the
optimizer step not), one round at a time, and keeps each layer's median over the rounds; the runner gives the ranks
turns round by round after a warm-up round, until a wall-clock budget is spent (so the other ranks never wait long
for one, however loaded the host); `time_layers` does the same in one process.
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

__all__ = ["LayerTiming", "LayerTimer", "time_layers", "costs_from_timings", "analytic_layer_costs", "PARAM_COPIES",
           "job_layer_profiles"]

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


class LayerTimer:
    """Times every layer of `model` on micro-batches of `batch` examples (ids 0..batch-1), one round at a time, so
    that ranks can take turns round by round (each rank's samples then spread over the whole benchmark, and a
    burst of load from other processes hits every rank alike)."""

    def __init__(self, model: LayeredModel, batch: int, *, seed: int = 0, slowdown: float = 1.0) -> None:
        from nebula.balance.simulate import Slowdown

        self.model, self.slow = model, Slowdown(compute=slowdown)
        self.layers = build_layers(model, 0, model.num_layers, seed)
        self.opts = [model.build_optimizer(list(layer.parameters())) for layer in self.layers]
        self.ids = np.arange(batch)
        self.samples: list[list[tuple[float, float, float]]] = [[] for _ in self.layers]
        self.shapes: list[tuple[int, int]] = [(0, 0)] * len(self.layers)

    def round(self, record: bool = True) -> None:
        """Run every layer once, forward, backward and optimizer step (`record=False`: a warm-up round)."""
        import paddle

        model, slow, ids, last = self.model, self.slow, self.ids, self.model.num_layers - 1
        x = None
        for i, layer in enumerate(self.layers):
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
            self.opts[i].step()
            self.opts[i].clear_grad()
            t3 = time.perf_counter()
            if record:
                self.samples[i].append((t1 - t0, t2 - t1, t3 - t2))
            self.shapes[i] = (_nbytes(xin), _nbytes(y) if i < last else 0)
            x = y

    def result(self) -> list[LayerTiming]:
        """Median per layer of the recorded rounds."""
        if not self.samples[0]:
            raise RuntimeError("no timed round yet: call round() after a warm-up round")
        out = []
        for layer, s, (inp, outp) in zip(self.layers, self.samples, self.shapes):
            out.append(LayerTiming(statistics.median(a for a, _, _ in s), statistics.median(b for _, b, _ in s),
                                   statistics.median(c for _, _, c in s), sum(_nbytes(p) for p in layer.parameters()),
                                   inp, outp, sum(int(np.prod(p.shape)) for p in layer.parameters())))
        return out


def time_layers(model: LayeredModel, batch: int, *, seed: int = 0, slowdown: float = 1.0, budget_s: float = 2.0,
                min_rounds: int = 3, max_rounds: int = 50) -> list[LayerTiming]:
    """Time every layer of `model` in this process: a warm-up round, then rounds until `budget_s` is spent."""
    timer = LayerTimer(model, batch, seed=seed, slowdown=slowdown)
    timer.round(record=False)
    start = time.perf_counter()
    for n in range(max_rounds):
        timer.round()
        if n + 1 >= min_rounds and time.perf_counter() - start >= budget_s:
            break
    return timer.result()


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


def job_layer_profiles(job: Any) -> list:
    """`nebula.balance.profile.measure_layers` of a job file's recipe layers (its `layered()` model), on one
    micro-batch of the job's size (train.global_batch over the smallest cluster's ranks and micro_batches), named by
    the model's `names()` when it has one; ValueError naming what is missing."""
    from nebula.balance.profile import measure_layers
    from nebula.config.job import load_job_config
    from nebula.hybrid.layered import layered_model
    from nebula.pipeline.stage import load_recipe

    cfg = load_job_config(job)
    model = layered_model(load_recipe(cfg.recipe))
    t = cfg.train
    world = min(c.world_size for c in cfg.clusters)
    batch = max(t.global_batch // (world * t.micro_batches), 1)
    names = model.names() if callable(getattr(model, "names", None)) else None
    layers = build_layers(model, 0, model.num_layers, t.seed)
    return measure_layers(layers, model.inputs(np.arange(batch)), names=names)
