"""Layer profile of real Paddle layers: FLOPs, measured forward+backward time, and the bytes each layer holds.

`measure_layers` runs the layers in model order on an example input (each layer gets the previous one's output),
with forward hooks on every sublayer that record shapes. FLOPs are counted analytically per sublayer type (Linear
2 x inputs x out_features, Embedding and LayerNorm per element, the attention core of MultiHeadAttention
4 x batch x q_len x k_len x embed_dim; any other leaf with a 2-D weight matching its input, such as a model
library's LM head, as a Linear); a layer with parameters but no known sublayer falls back to `paddle.flops`
(recorded in `flops_source`). A training iteration counts 3x the forward FLOPs. Time is the median of `repeat`
forward+backward passes after `warmup` passes (synchronised on GPU). Bytes, for the dtype of the parameters:
parameters, gradients (same dtype), optimizer state (`optimizer_states` fp32 values per parameter), activations
kept for backward (estimated as every leaf sublayer's output plus the attention probabilities) and the output.
Profiles are saved to and loaded from YAML through `nebula.config`.
"""
from __future__ import annotations

import contextlib
import io
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import yaml

from nebula.balance.cost import LayerCost

__all__ = ["LayerProfile", "ProfileFile", "measure_layers", "save_profile", "load_profile"]


@dataclass(frozen=True, kw_only=True, slots=True)
class LayerProfile:
    """One layer, measured: FLOPs per iteration, forward+backward seconds, and bytes by kind."""

    name: str
    kind: str  # the Paddle class name
    flops: float
    flops_source: str  # analytic | paddle.flops | none
    time_s: float
    param_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    activation_bytes: int  # kept for backward
    output_bytes: int

    def cost(self) -> LayerCost:
        """The LayerCost allocators use: all held bytes as memory, the output as the activation sent on."""
        memory = self.param_bytes + self.grad_bytes + self.optimizer_bytes + self.activation_bytes
        return LayerCost(float(self.flops), float(memory), float(self.output_bytes), name=self.name)


@dataclass(frozen=True, kw_only=True, slots=True)
class ProfileFile:
    """A saved profile: the model's layers in order (what `nebula allocate --model FILE` reads)."""

    layers: tuple[LayerCost, ...]

    def __post_init__(self) -> None:
        if not self.layers:
            raise ValueError("layers is empty; a profile lists every layer of the model in order")


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def _elsize(t: Any) -> int:
    return int(t.element_size())


def _tensors(obj: Any) -> list:
    import paddle

    if isinstance(obj, paddle.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for o in obj for t in _tensors(o)]
    return []


def _projection(sub, ins: list) -> bool:
    """A leaf of another type whose 2-D `weight` has the input's last dimension on one side (a matrix product)."""
    import paddle

    w = getattr(sub, "weight", None)
    return (bool(ins) and isinstance(w, paddle.Tensor) and len(w.shape) == 2 and paddle.is_floating_point(ins[0])
            and int(ins[0].shape[-1]) in (int(w.shape[0]), int(w.shape[1])))


def _forward_counts(layer, x) -> tuple[float, int, bool]:
    """(forward FLOPs, saved activation bytes, whether any sublayer type was known) from one hooked forward pass."""
    from paddle import nn

    flops, saved, known = 0.0, 0, False
    hooks = []

    def hook(sub, inputs, output):
        nonlocal flops, saved, known
        ins, outs = _tensors(inputs), _tensors(output)
        if isinstance(sub, nn.MultiHeadAttention) and ins:
            q = ins[0].shape
            k = ins[1].shape if len(ins) > 1 else q
            flops += 4.0 * q[0] * q[1] * k[1] * sub.embed_dim
            saved += 2 * q[0] * sub.num_heads * q[1] * k[1] * _elsize(ins[0])
            known = True
            return
        if list(sub.children()):
            return  # containers: their leaves are counted
        if isinstance(sub, nn.Linear) and ins:
            flops += 2.0 * _numel(ins[0].shape) * sub.weight.shape[1]
            known = True
        elif isinstance(sub, nn.Embedding) and outs:
            flops += float(_numel(outs[0].shape))
            known = True
        elif isinstance(sub, nn.LayerNorm) and outs:
            flops += 5.0 * _numel(outs[0].shape)
            known = True
        elif _projection(sub, ins):  # a library's own linear (an LM head): inputs x the weight's other side
            w = sub.weight.shape
            flops += 2.0 * _numel(ins[0].shape) * (int(w[0]) * int(w[1]) // int(ins[0].shape[-1]))
            known = True
        saved += sum(_numel(o.shape) * _elsize(o) for o in outs)

    for sub in [layer, *layer.sublayers()]:
        hooks.append(sub.register_forward_post_hook(hook))
    try:
        layer(x)
    finally:
        for h in hooks:
            h.remove()
    return flops, saved, known


def _paddle_flops(layer, x) -> float | None:
    import paddle

    try:
        with contextlib.redirect_stdout(io.StringIO()):  # paddle.flops prints its table
            n = paddle.flops(layer, list(x.shape), print_detail=False)
        return float(n) if n else None
    except Exception:  # noqa: BLE001 -- paddle.flops fails on many layer types; the caller records 'none'
        return None


def _sync() -> None:
    import paddle

    if paddle.device.get_device().startswith("gpu"):
        paddle.device.synchronize()


def _time_fwd_bwd(layer, x, warmup: int, repeat: int) -> float:
    import paddle

    times = []
    for it in range(warmup + repeat):
        _sync()
        start = time.perf_counter()
        out = layer(x)
        paddle.sum(out.astype("float32")).backward()
        _sync()
        if it >= warmup:
            times.append(time.perf_counter() - start)
        layer.clear_gradients()
        if not x.stop_gradient:
            x.clear_gradient()
    return statistics.median(times)


def measure_layers(layers: Sequence, example: Any, *, names: Sequence[str] | None = None, warmup: int = 2,
                   repeat: int = 5, optimizer_states: int = 2) -> list[LayerProfile]:
    """Profile Paddle `layers` in model order on `example` (the first layer's input); see the module docstring."""
    import paddle

    if warmup < 0 or repeat < 1:
        raise ValueError(f"warmup={warmup} must be >= 0 and repeat={repeat} >= 1")
    if names is not None and len(names) != len(layers):
        raise ValueError(f"got {len(names)} names for {len(layers)} layers; give one name per layer or none")
    out: list[LayerProfile] = []
    x = example
    for k, layer in enumerate(layers):
        x = x.detach()
        if paddle.is_floating_point(x):
            x.stop_gradient = False
        fwd, saved, known = _forward_counts(layer, x)
        source = "analytic" if known else "none"
        params = [p for p in layer.parameters() if not p.stop_gradient]
        if not known and params:
            pf = _paddle_flops(layer, x)
            if pf is not None:
                fwd, source = pf, "paddle.flops"
        elapsed = _time_fwd_bwd(layer, x, warmup, repeat)
        with paddle.no_grad():
            y = layer(x)
        param_bytes = sum(_numel(p.shape) * _elsize(p) for p in params)
        out.append(LayerProfile(
            name=names[k] if names is not None else f"{k}:{type(layer).__name__}", kind=type(layer).__name__,
            flops=3.0 * fwd, flops_source=source, time_s=elapsed, param_bytes=param_bytes, grad_bytes=param_bytes,
            optimizer_bytes=sum(_numel(p.shape) for p in params) * 4 * optimizer_states,
            activation_bytes=saved + _numel(x.shape) * _elsize(x), output_bytes=_numel(y.shape) * _elsize(y)))
        x = y
    return out


def save_profile(path: str | Path, layers: Sequence[LayerCost | LayerProfile]) -> None:
    """Write layer costs (or profiles, as their costs) to a YAML profile file."""
    costs = [x.cost() if isinstance(x, LayerProfile) else x for x in layers]
    data = {"layers": [{"name": c.name, "flops": float(c.flops), "memory_bytes": float(c.memory_bytes),
                        "activation_bytes": float(c.activation_bytes)} for c in costs]}
    Path(path).write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")


def load_profile(path: str | Path) -> list[LayerCost]:
    """Read a YAML profile file (a `layers:` list of name, flops, memory_bytes, activation_bytes)."""
    from nebula.config.schema import load_yaml

    return list(load_yaml(ProfileFile, path).layers)
