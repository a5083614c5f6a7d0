"""Lossless entropy coding of a codec's integer codes: `huffman(inner)`.

A quantizer's codes are not uniform: an int4/int8 grid puts most values near zero, and an FP4 block's codes
cluster too when the block holds a heavy tail. `huffman(inner)` sends each integer part of `inner`'s encoding
(the packed codes; scales and float parts stay as they are) Huffman-coded with zlib's deflate in Huffman-only mode:
every byte (two 4-bit codes, one int8 code) gets a code of about its information content, with no search for
repeats, so it costs a few ms per MB. A part that would not shrink is sent as it was. The receiver inflates each
part to exactly the size the header names, bounded by the tensor it decodes to, and refuses anything else in one
line: a hostile header cannot make it allocate more than the tensor's own bounds allow.

Measured on 1.6M-element tensors (see the tests): `huffman(int4_block)` 0.42-0.50 bytes per element against 0.5625
without, `huffman(fp4(block=64))` 0.49-0.52 against 0.53 on normal to heavy-tailed data.
"""
from __future__ import annotations

import zlib
from dataclasses import replace
from typing import Any

import numpy as np

from . import backend as B
from .base import CodecError, ElementCodec, Encoded, SpecError, decode_encoded, parse_args, register_codec, split_inner
from .delta import is_keyed
from .spec import SpecNode

__all__ = ["HuffmanCodec", "deflate_codes", "inflate_codes"]

_MIN_BYTES = 64  # parts below this stay raw: the deflate block header would eat the gain
_WBITS = -15  # raw deflate: no zlib header or checksum (the channel's TLS already guards integrity)
_INT_DTYPES = ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64")


def deflate_codes(data: bytes | memoryview) -> bytes:
    """`data` Huffman-coded (deflate, Huffman-only: no match search)."""
    c = zlib.compressobj(1, zlib.DEFLATED, _WBITS, 9, zlib.Z_HUFFMAN_ONLY)
    return c.compress(data) + c.flush()


def inflate_codes(data: bytes | memoryview, size: int, where: str) -> bytes:
    """Exactly `size` bytes inflated from `data`; CodecError naming `where` when the stream is malformed, ends
    early, holds more, or has bytes after its end (it is never inflated past `size`)."""
    d = zlib.decompressobj(_WBITS)
    try:
        out = d.decompress(data, size)
    except zlib.error as exc:
        raise CodecError(f"{where}: the Huffman-coded part does not inflate ({exc}); the frames are corrupted") from None
    if d.unconsumed_tail:
        got = f"more than {size} bytes"
    elif not d.eof:
        got = f"{len(out)} bytes and no end"
    elif len(out) != size or d.unused_data:
        got = f"{len(out)} bytes" + (f" with {len(d.unused_data)} bytes after its end" if d.unused_data else "")
    else:
        return out
    raise CodecError(f"{where}: the Huffman-coded part holds {got}, not the {size} bytes its header names; the "
                     "frames are corrupted")


def _map_leaves(enc: Encoded, fn: Any, counter: list[int]) -> Encoded:
    """`enc` with every payload array a replaced by fn(index, a), indices in wire order (`Encoded.leaves`)."""
    parts = {}
    for k, v in enc.parts.items():
        if isinstance(v, Encoded):
            parts[k] = _map_leaves(v, fn, counter)
        else:
            parts[k] = fn(counter[0], v)
            counter[0] += 1
    return replace(enc, parts=parts, _header=None)


@register_codec
class HuffmanCodec(ElementCodec):
    """Huffman-codes the integer parts of `inner`'s encoding, losslessly (holds its inner like an element codec,
    whose state and spec handling it shares, but codes the inner's whole tree rather than its float parts)."""

    name = "huffman"
    usage = "huffman(inner), e.g. huffman(fp4(block=64)) or ef(huffman(int4_block)); inner is the lossy codec"
    raw_parts = True  # _decode inflates the inner tree itself before it is decoded

    @classmethod
    def from_spec(cls, node: SpecNode) -> "HuffmanCodec":
        inner, rest = split_inner(node, cls.usage)
        parse_args(rest, (), {}, cls.usage)
        if inner is None:
            raise SpecError(f"codec 'huffman' needs the codec whose codes it entropy-codes; usage: {cls.usage}")
        if is_keyed(inner):  # its rows need their sample ids, which only the keyed codec itself is given
            raise SpecError(f"codec 'huffman({inner.spec})': a keyed codec goes outside, with huffman on its deltas: "
                            f"e.g. delta(huffman(int2_block), first=int4_block)")
        return cls(inner)

    def _encode_leaf(self, x: Any) -> Encoded:  # never called: _encode codes the inner tree
        raise NotImplementedError

    def _encode(self, x: Any) -> Encoded:
        inner = self.inner._encode(x)
        coded: list[list[Any]] = []

        def code(i: int, a: Any) -> Any:
            dt = B.dtype_name(a)
            if dt not in _INT_DTYPES or B.nbytes_of(a) < _MIN_BYTES:
                return a
            h = B.to_host(a)
            z = deflate_codes(memoryview(h.reshape(-1).view(np.uint8)))
            if len(z) >= h.nbytes:
                return a
            coded.append([i, dt, list(B.shape_of(a))])
            return np.frombuffer(z, np.uint8)

        tree = _map_leaves(inner, code, [0])
        return Encoded(self.spec, B.dtype_name(x), B.shape_of(x), {"codes": tree}, meta={"huffman": coded},
                       kind=B.kind_of(x))

    def _decode(self, enc: Encoded, parts: dict[str, Any]) -> Any:
        tree = parts.get("codes")
        coded = enc.meta.get("huffman")
        where = f"codec {enc.codec!r}"
        if not isinstance(tree, Encoded) or not isinstance(coded, list):
            raise CodecError(f"{where}: malformed encoding (no inner tree or no list of coded parts); the frames are "
                             "corrupted or from another format")
        if tuple(tree.shape) != tuple(enc.shape):  # the budget below is the outer shape's: the inner must be it
            raise CodecError(f"{where}: the inner tree decodes to shape {list(tree.shape)[:8]}, not the "
                             f"{list(enc.shape)} its header names; the frames are corrupted or hostile")
        n = int(np.prod(enc.shape, dtype=np.int64))
        budget = 8 * n + 4096  # codes of a lossy codec of n elements never exceed 8 bytes each
        plan: dict[int, tuple[str, tuple[int, ...]]] = {}
        for item in coded:
            ok = (isinstance(item, list) and len(item) == 3 and isinstance(item[0], int) and item[1] in _INT_DTYPES
                  and isinstance(item[2], list) and len(item[2]) <= 32
                  and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in item[2]))
            if not ok or item[0] in plan:
                raise CodecError(f"{where}: coded part {str(item)[:80]} is not a unique [index, integer dtype, shape]; "
                                 "the frames are corrupted")
            size = int(np.prod(item[2], dtype=np.int64)) * B.WIRE_DTYPES[item[1]]
            budget -= size
            if budget < 0:
                raise CodecError(f"{where}: the coded parts declare more bytes than a tensor of shape {enc.shape} can "
                                 "need; the frames are corrupted or hostile")
            plan[item[0]] = (item[1], tuple(item[2]))

        def restore(i: int, a: Any) -> Any:
            if i not in plan:
                return a
            dt, shape = plan.pop(i)
            size = int(np.prod(shape, dtype=np.int64)) * B.WIRE_DTYPES[dt]
            raw = inflate_codes(memoryview(B.to_host(a).reshape(-1).view(np.uint8)), size, f"{where} part {i}")
            h = np.frombuffer(raw, dt).reshape(shape)
            return B.from_host(h, dt, enc.kind, getattr(a, "place", None))  # (coded here: numpy whatever the kind)

        tree = _map_leaves(tree, restore, [0])
        if plan:
            raise CodecError(f"{where}: coded part(s) {sorted(plan)} name no payload of the inner tree; the frames "
                             "are corrupted")
        return decode_encoded(tree)
