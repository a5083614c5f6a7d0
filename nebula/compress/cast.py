"""Lossless identity and floating-point narrowing codecs: `none`, `fp16`, `bf16`."""
from __future__ import annotations

from typing import Any

import numpy as np

from . import backend as B
from . import quantize as Q
from .base import Codec, CodecError, ElementCodec, Encoded, check_finite, parse_args, register_codec, raw_encoded
from .spec import SpecNode

__all__ = ["NoneCodec", "FP16Codec", "BF16Codec"]


@register_codec
class NoneCodec(Codec):
    """Identity: the raw bytes of the tensor, any dtype, bit exact."""

    name = "none"
    lossy = False

    @property
    def spec(self) -> str:
        return "none"

    @classmethod
    def from_spec(cls, node: SpecNode) -> "NoneCodec":
        parse_args(node, (), {}, "none")
        return cls()

    def _encode(self, x: Any) -> Encoded:
        return raw_encoded(x)

    def _decode(self, enc: Encoded, parts: dict[str, Any]) -> Any:
        data = parts["data"]
        if not B.is_paddle(data) and data.dtype == np.uint16 and enc.dtype == "bfloat16":  # bf16 bits on the host
            return Q.from_bf16(data, "float32")
        return data


@register_codec
class FP16Codec(ElementCodec):
    """IEEE half precision: 2 bytes per element, relative error <= 2^-11 (paper: FP16 activations)."""

    name = "fp16"
    usage = "fp16 or fp16(inner), e.g. fp16(svd(0.6))"

    def _encode_leaf(self, x: Any) -> Encoded:
        try:
            h = Q.to_fp16(x)
        except OverflowError as exc:
            check_finite(x, self.spec)  # NaN/Inf get the NonFiniteError; finite values are just too large
            raise CodecError(f"codec {self.spec!r}: {exc}; use 'bf16' or an int8 codec") from None
        return Encoded(self.leaf_spec, B.dtype_name(x), B.shape_of(x), {"h": h}, kind=B.kind_of(x))

    def _decode(self, enc: Encoded, parts: dict[str, Any]) -> Any:
        return Q.from_fp16(parts["h"], B.compute_dtype(enc.dtype))


@register_codec
class BF16Codec(ElementCodec):
    """bfloat16: 2 bytes per element, FP32's range, relative error <= 2^-8."""

    name = "bf16"
    usage = "bf16 or bf16(inner)"

    def _encode_leaf(self, x: Any) -> Encoded:
        if B.is_paddle(x):
            check_finite(x, self.spec)
        try:
            b = Q.to_bf16(x)
        except OverflowError as exc:
            check_finite(x, self.spec)
            raise CodecError(f"codec {self.spec!r}: {exc}; use 'none'") from None
        return Encoded(self.leaf_spec, B.dtype_name(x), B.shape_of(x), {"b": b}, kind=B.kind_of(x))

    def _decode(self, enc: Encoded, parts: dict[str, Any]) -> Any:
        return Q.from_bf16(parts["b"], B.compute_dtype(enc.dtype))
