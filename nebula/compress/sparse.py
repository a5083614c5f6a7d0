"""Sparsification codec `topk(f)`: keep the fraction f of elements with the largest magnitude, as (index, value) pairs."""
from __future__ import annotations

from typing import Any

import numpy as np

from . import backend as B
from .base import Codec, CodecError, Encoded, check_finite, parse_args, register_codec
from .spec import SpecError, SpecNode

__all__ = ["TopKCodec", "topk_select", "topk_scatter"]


def topk_select(flat: Any, k: int) -> tuple[Any, Any]:
    """Indices (int32 when they fit, else int64) and values of the k largest-magnitude elements of flat x."""
    n = B.numel(flat)
    if B.is_paddle(flat):
        import paddle

        idx = paddle.topk(paddle.abs(flat), k, sorted=False)[1]
        return paddle.cast(idx, "int32" if n < 2**31 else "int64"), paddle.gather(flat, idx)
    idx = np.arange(n) if k >= n else np.argpartition(np.abs(flat), n - k)[n - k:]
    idx = np.sort(idx).astype(np.int32 if n < 2**31 else np.int64)  # sorted: the scatter on decode walks memory once
    return idx, flat[idx]


def topk_scatter(idx: Any, val: Any, n: int, dtype: str) -> Any:
    """Dense flat tensor of length n with val at idx and zeros elsewhere."""
    if B.is_paddle(val):
        import paddle

        out = paddle.zeros([n], dtype=dtype)
        return paddle.scatter(out, paddle.cast(idx, "int64"), paddle.cast(val, dtype))
    out = np.zeros(n, dtype)
    out[idx] = val
    return out


class FractionArg(Codec):
    """A codec of one argument, the fraction f in (0, 1] of elements it keeps (`name(f)`)."""

    def __init__(self, fraction: float):
        self.fraction = fraction

    @property
    def spec(self) -> str:
        return f"{self.name}({self.fraction!r})"

    @classmethod
    def from_spec(cls, node: SpecNode):
        ok = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 1  # noqa: E731
        args = parse_args(node, ("f",), {"f": ok}, cls.usage)
        if "f" not in args:
            raise SpecError(f"codec {cls.name!r} needs the fraction of elements to keep; usage: {cls.usage}")
        return cls(args["f"])


@register_codec
class TopKCodec(FractionArg):
    """Top-k sparsification: round(f*n) (at least 1) largest |x| as int32 indices plus values; pair it with ef(...)."""

    name = "topk"
    usage = "topk(f) with f in (0, 1], the fraction of elements kept, e.g. ef(topk(0.01))"

    def _encode(self, x: Any) -> Encoded:
        check_finite(x, self.spec)
        n = B.numel(x)
        k = max(1, min(n, int(round(self.fraction * n))))
        idx, val = topk_select(B.reshape(x, (n,)), k)
        return Encoded(self.spec, B.dtype_name(x), B.shape_of(x), {"idx": idx, "val": val}, kind=B.kind_of(x))

    def _decode(self, enc: Encoded, parts: dict[str, Any]) -> Any:
        idx, val = parts["idx"], parts["val"]
        n = int(np.prod(enc.shape, dtype=np.int64))
        if B.numel(idx) != B.numel(val) or B.numel(idx) > n:
            raise CodecError(f"codec {enc.codec!r}: {B.numel(idx)} indices for {B.numel(val)} values in a tensor of "
                             f"{n} elements; the frames are corrupted")
        if not B.is_paddle(idx) and idx.size and (int(idx.min()) < 0 or int(idx.max()) >= n):
            raise CodecError(f"codec {enc.codec!r}: an index lies outside [0, {n}); the frames are corrupted")
        return topk_scatter(idx, val, n, B.compute_dtype(enc.dtype))
