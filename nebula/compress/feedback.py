"""Error feedback `ef(inner)`: the compression error of each step is added to the next step's input (per instance)."""
from __future__ import annotations

from typing import Any

from . import backend as B
from .base import Codec, CodecError, Encoded, codec_from_node, decode, register
from .spec import SpecError, SpecNode, format_spec

__all__ = ["ErrorFeedbackCodec"]


@register
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

    def _encode(self, x: Any) -> Encoded:
        key = (B.shape_of(x), B.dtype_name(x), B.kind_of(x))
        r = self._residual.get(key)
        xc = x if r is None else x + r
        enc = self.inner._encode(xc)
        self._residual[key] = xc - decode(enc)
        return enc

    def _decode(self, enc: Encoded, parts: dict[str, Any]) -> Any:
        raise CodecError("ef(...) nodes never go on the wire; decode the inner codec's encoding instead")
