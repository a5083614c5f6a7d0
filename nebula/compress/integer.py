"""Integer quantization codecs with absmax scales: `int8` (per tensor, the paper's), `int8_row`, `int8_block`,
`int4_block`, `int3_block`."""
from __future__ import annotations

from typing import Any

import numpy as np

from . import backend as B
from . import quantize as Q
from .base import CodecError, ElementCodec, Encoded, check_finite, parse_args, register_codec, split_inner
from .spec import SpecNode

__all__ = ["Int8Codec", "Int8RowCodec", "Int8BlockCodec", "Int4BlockCodec", "Int3BlockCodec", "BlockArgs"]


def _is_block(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 1 << 24


def _all_finite(a: Any) -> bool:
    if B.is_paddle(a):
        import paddle

        return bool(paddle.isfinite(a).all())
    return bool(np.isfinite(a).all())


class _BlockQuantCodec(ElementCodec):
    """Symmetric absmax quantization to `levels` per block; subclasses say how blocks are formed."""

    levels: int = 127
    packed: bool = False

    def _block_of(self, x: Any) -> int:
        raise NotImplementedError

    def _encode_leaf(self, x: Any) -> Encoded:
        block = max(1, min(self._block_of(x), B.numel(x)))
        q, scales = Q.quantize_blocks(x, block, self.levels)
        if not _all_finite(scales):
            check_finite(x, self.spec)
            raise CodecError(f"codec {self.spec!r}: scale overflow; use 'bf16' for values this large")
        if self.packed:
            q = Q.pack_int4(q)
        return Encoded(self.leaf_spec, B.dtype_name(x), B.shape_of(x), {"q": q, "scales": scales},
                       meta={"block": block}, kind=B.kind_of(x))

    def _decode(self, enc: Encoded, parts: dict[str, Any]) -> Any:
        n = int(np.prod(enc.shape, dtype=np.int64))
        q = Q.unpack_int4(parts["q"], n) if self.packed else parts["q"]
        block = enc.meta.get("block")
        if not isinstance(block, int) or block < 1 or B.numel(q) != n:
            raise CodecError(f"codec {enc.codec!r}: malformed encoding (block={block!r}, {B.numel(q)} values for "
                             f"shape {enc.shape}); the sender and receiver disagree on the format")
        return Q.dequantize_blocks(q, parts["scales"], block, B.compute_dtype(enc.dtype))


class BlockArgs:
    """The `block=` argument of a per-block element codec (`name`, `name(block=B)`, `name(inner, block=B)`); the
    class sets `default_block`."""

    default_block: int = 64

    def __init__(self, inner: Any = None, block: int | None = None):
        super().__init__(inner)
        self.block = self.default_block if block is None else block

    @property
    def leaf_spec(self) -> str:
        return f"{self.name}({self.block})"

    @classmethod
    def from_spec(cls, node: SpecNode):
        inner, rest = split_inner(node, cls.usage)
        args = parse_args(rest, ("block",), {"block": _is_block}, cls.usage)
        return cls(inner, args.get("block"))


@register_codec
class Int8Codec(_BlockQuantCodec):
    """The paper's INT8: one absmax scale per tensor, q = round(127 x / max|x|), |error| <= max|x| / 254."""

    name = "int8"
    usage = "int8 or int8(inner)"

    def _block_of(self, x: Any) -> int:
        return B.numel(x)


@register_codec
class Int8RowCodec(_BlockQuantCodec):
    """INT8 with one scale per row (per channel of the last dimension's rows): |error| <= max|row| / 254."""

    name = "int8_row"
    usage = "int8_row or int8_row(inner)"

    def _block_of(self, x: Any) -> int:
        shape = B.shape_of(x)
        return shape[-1] if shape else 1


@register_codec
class Int8BlockCodec(BlockArgs, _BlockQuantCodec):
    """INT8 with one FP32 scale per `block` consecutive elements (default 64): 1.0625 bytes per element."""

    name = "int8_block"
    usage = "int8_block, int8_block(block=64) or int8_block(inner, block=64); block in 1..2^24"
    default_block = 64

    def _block_of(self, x: Any) -> int:
        return self.block


@register_codec
class Int4BlockCodec(Int8BlockCodec):
    """4-bit symmetric absmax per block (default 64), two values per byte: |error| <= max|block| / 14."""

    name = "int4_block"
    usage = "int4_block, int4_block(block=64) or int4_block(inner, block=64); block in 1..2^24"
    levels = 7
    packed = True


@register_codec
class Int3BlockCodec(Int8BlockCodec):
    """Seven levels (-3..3) per block of absmax (default 64), |error| <= max|block| / 6, a code per byte: meant
    inside `huffman`, which sends the codes at about their entropy (about 2 bits a code on Laplace-like data, as
    deltas tend to be: 0.31 bytes per element with the scales)."""

    name = "int3_block"
    usage = ("int3_block, int3_block(block=64) or int3_block(inner, block=64); block in 1..2^24; one byte per code "
             "as sent, so wrap it: huffman(int3_block)")
    levels = 3
