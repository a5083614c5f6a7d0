"""Error feedback `ef(inner)`: the compression error of each step is added to the next step's input (per instance).

The residuals and the inner codec's own state (e.g. `lowrank`'s warm starts) are the codec's whole state and can
leave it: `export_state` gives the residuals as numpy arrays under string keys (`residual:<kind>:<dtype>:<shape>`,
see `residual_key`) and the inner codec's state under `inner.`; `import_state` takes them back after checking them,
so that a checkpoint can carry them and a resumed sender goes on exactly where it stopped. A state holding
residuals only (saved before the inner state was kept) leaves the inner codec cold, as it was then.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from . import backend as B
from .base import (Codec, CodecError, Encoded, codec_from_node, decode_encoded, nest_state, register_codec,
                   split_state)
from .spec import SpecError, SpecNode, format_spec

__all__ = ["ErrorFeedbackCodec", "residual_key", "parse_residual_key", "check_state"]

_KINDS = ("numpy", "paddle")


def residual_key(shape: tuple[int, ...], dtype: str, kind: str) -> str:
    """The string key of a residual: `residual:<kind>:<dtype>:<d0,d1,...>` (no '/', so it nests in a path)."""
    return f"residual:{kind}:{dtype}:{','.join(str(int(d)) for d in shape)}"


def parse_residual_key(key: str) -> tuple[tuple[int, ...], str, str]:
    """(shape, dtype, kind) of a `residual_key`; ValueError when `key` is not one."""
    parts = key.split(":")
    if len(parts) != 4 or parts[0] != "residual" or parts[1] not in _KINDS or not B.is_float_dtype(parts[2]):
        raise ValueError(f"key {key!r} is not residual:<numpy|paddle>:<float dtype>:<shape>")
    try:
        shape = tuple(int(d) for d in parts[3].split(",")) if parts[3] else ()
    except ValueError:
        raise ValueError(f"key {key!r} has shape {parts[3]!r}, not comma-separated sizes") from None
    if any(d < 0 for d in shape):
        raise ValueError(f"key {key!r} has a negative size")
    return shape, parts[2], parts[1]


def check_state(state: Mapping[str, Any], *, shape: tuple[int, ...] | None = None,
                name: str = "the tensor") -> dict[tuple, np.ndarray]:
    """The residuals of an `export_state` dict by (shape, dtype, kind), checked: well-formed keys, arrays of the
    key's shape and dtype, finite values, and (given `shape`) only residuals of that shape. CodecError names `name`
    and the mismatch."""
    out = {}
    for key, value in state.items():
        try:
            rshape, dtype, kind = parse_residual_key(str(key))
        except ValueError as exc:
            raise CodecError(f"error-feedback state of {name}: {exc}; it was written by another version") from None
        a = np.asarray(value)
        if a.shape != rshape or a.dtype.name != dtype:
            raise CodecError(f"error-feedback state of {name}: residual {key!r} holds a {a.dtype.name} array of "
                             f"shape {a.shape}, not the {dtype} {rshape} its key names; the state is corrupted")
        if shape is not None and rshape != tuple(shape):
            raise CodecError(f"error-feedback state of {name}: residual of shape {rshape} but the tensor has shape "
                             f"{tuple(shape)}; it was saved for another model or other settings")
        if not np.isfinite(a).all():
            raise CodecError(f"error-feedback state of {name}: residual {key!r} holds NaN or Inf; the state is "
                             "corrupted")
        out[(rshape, dtype, kind)] = np.array(a, copy=True)
    return out


@register_codec
class ErrorFeedbackCodec(Codec):
    """Sends inner(x + e) and keeps e = (x + e) - decoded, so the sum of decoded tensors tracks the sum of inputs.

    The receiver needs no state: the wire carries the inner codec's encoding. Keep one instance per channel and
    direction; tensors of different shape/dtype keep separate residuals.
    """

    name = "ef"
    usage = "ef(inner), e.g. ef(int8), ef(topk(0.01)), ef(fp16(lowrank(rank=4)))"

    def __init__(self, inner: Codec):
        self.inner = inner
        self._residual: dict[tuple, Any] = {}

    @property
    def spec(self) -> str:
        return f"ef({self.inner.spec})"

    @classmethod
    def from_spec(cls, node: SpecNode) -> "ErrorFeedbackCodec":
        if len(node.args) != 1 or node.kwargs or not isinstance(node.args[0], SpecNode):
            raise SpecError(f"codec {format_spec(node)!r}: takes exactly one inner codec; usage: {cls.usage}")
        return cls(codec_from_node(node.args[0]))

    def reset(self) -> None:
        """Drop the accumulated residuals."""
        self._residual.clear()

    def residual(self, shape: tuple[int, ...], dtype: str = "float32", kind: str = "numpy") -> Any:
        """The residual currently carried for tensors of this shape (None if none yet)."""
        return self._residual.get((tuple(shape), dtype, kind))

    @property
    def stateful(self) -> bool:
        return True

    def export_state(self) -> dict[str, np.ndarray]:
        """Every residual as a host numpy copy under its `residual_key`, and the inner codec's state (e.g. a
        low-rank warm start) under `inner.`."""
        out = {residual_key(*k): np.array(B.to_host(r), copy=True) for k, r in self._residual.items()}
        out.update(nest_state(self.inner.export_state()))
        return out

    def import_state(self, state: Mapping[str, Any], *, shape: tuple[int, ...] | None = None,
                     name: str = "the tensor") -> None:
        """Replace the residuals with those of `state` (an `export_state` dict), checked by `check_state`, and the
        inner codec's state with its part; on a CodecError the codec keeps its state as it was."""
        own, inner = split_state(state)
        checked = check_state(own, shape=shape, name=name)
        self.inner.import_state(inner, shape=shape, name=name)  # last check: it changes nothing when it refuses
        self._residual = {k: B.from_host(a, k[1], k[2]) for k, a in checked.items()}

    def _encode(self, x: Any) -> Encoded:
        key = (B.shape_of(x), B.dtype_name(x), B.kind_of(x))
        r = self._residual.get(key)
        xc = x if r is None else x + r
        enc = self.inner._encode(xc)
        self._residual[key] = xc - decode_encoded(enc)
        return enc

    def _decode(self, enc: Encoded, parts: dict[str, Any]) -> Any:
        raise CodecError("ef(...) nodes never go on the wire; decode the inner codec's encoding instead")
