"""Low-bit outer-gradient codecs: `fp4` (FP4 E2M1 per block, as Streaming DiLoCo sends) and `topk2` (top-k with
2-bit values, as SparseLoCo sends); pair either with ``ef(...)`` so the compression error is fed back.

fp4: each element becomes one of ±{0, 0.5, 1, 1.5, 2, 3, 4, 6} times its block's scale, two codes per byte. The
scale is max|block| / 6 rounded to bfloat16 (2 bytes per block): at the default block of 32 that is 0.5625 bytes per
element, the bytes of ``int4_block(64)``. A power-of-two (MX e8m0, 1 byte) scale costs 1/32 byte less per element
but wastes up to half of the grid: measured on normal and heavy-tailed data, a bf16 scale per 32 elements has 10-30%
lower error than an e8m0 scale per 16 (the same bytes) and than e8m0 per 32 (6% fewer bytes). FP4's levels are
denser near zero than int4's: it beats ``int4_block`` on normal and heavy-tailed tensors, loses on light-tailed ones
(uniform-like AdamW weight deltas), so measure on the tensors you send.

topk2: the round(f*n) largest |x|; their sorted indices in Elias-Fano form (floor(log2(n/k)) low bits each, the
high parts as a unary bit vector: about 2 + log2(n/k) bits per index, 0.8 byte at f=0.05 instead of int32's 4), and
per kept value 2 bits (sign, magnitude bucket) with two scales per tensor: the mean |x| of the kept values in a
small and a large bucket, split by a few Lloyd iterations (the 2-level quantizer of least squared error).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from . import backend as B
from . import quantize as Q
from .base import CodecError, ElementCodec, Encoded, check_finite, register_codec
from .integer import BlockArgs
from .sparse import FractionArg, topk_scatter, topk_select

__all__ = ["FP4Codec", "TopK2Codec", "FP4_LEVELS", "fp4_error_bound"]

FP4_LEVELS = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # E2M1 magnitudes; code = index | sign << 3
_LUT = np.array(FP4_LEVELS + tuple(-v for v in FP4_LEVELS))
_MIDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_TIE_UP = (False, True, False, True, False, True, False)  # a tie rounds to the even code, as IEEE round-to-nearest
_LLOYD_STEPS = 8
_SUB_ROWS = 1 << 15  # elements per inner step of the numpy quantizer: temporaries stay in the L2 cache


def fp4_error_bound(x: float, block_max: float) -> float:
    """Largest |x - decoded| fp4 allows for element x in a block with max |value| block_max (>= ~1e-37).

    The scale s is max|block|/6 rounded to bfloat16 (at most 2^-8 above); between adjacent levels the error is at
    most half the gap: 0.25 s below 2 s, 0.5 s below 4 s (<= |x|/5), 1 s up to 6 s (<= |x|/5).
    """
    return max(block_max * (1 + 2.0**-8) / 24, abs(x) / 5)


def _thresholds(dtype: str) -> np.ndarray:
    """Decision points between levels: an element counts past a threshold when it is larger (or equal, for the
    ties that round up), so searchsorted(..., side='left') gives the level index with ties to the even code."""
    t = np.array(_MIDS, dtype)
    up = np.array(_TIE_UP)
    t[up] = np.nextafter(t[up], np.zeros(1, dtype))
    return t


@register_codec
class FP4Codec(BlockArgs, ElementCodec):
    """FP4 E2M1 per block (default 32) with a bfloat16 scale max|block|/6 per block, two codes per byte.

    0.5 + 2/block bytes per element; |error| <= max(1.004 max|block| / 24, |x| / 5) per element, round to nearest
    (ties to even).
    """

    name = "fp4"
    usage = "fp4, fp4(block=32) or fp4(inner, block=32); block in 1..2^24, e.g. ef(fp4)"
    default_block = 32

    def _encode_leaf(self, x: Any) -> Encoded:
        n = B.numel(x)
        block = max(1, min(self.block, n))
        enc = _fp4_encode_paddle if B.is_paddle(x) else _fp4_encode_numpy
        codes, scales = enc(x, block, n, self.spec)
        if n % 2:  # pad to whole bytes here: pack_int4's own padding nibble differs between numpy and paddle
            codes = (_pad_codes_paddle if B.is_paddle(codes) else _pad_codes_numpy)(codes)
        return Encoded(self.leaf_spec, B.dtype_name(x), B.shape_of(x), {"q": Q.pack_int4(codes), "scales": scales},
                       meta={"block": block}, kind=B.kind_of(x))

    def _decode(self, enc: Encoded, parts: dict[str, Any]) -> Any:
        n = int(np.prod(enc.shape, dtype=np.int64))
        block = enc.meta.get("block")
        q, scales = parts["q"], parts["scales"]
        if (not isinstance(block, int) or block < 1 or B.numel(q) != (n + 1) // 2
                or B.numel(scales) != -(-n // block)):
            raise CodecError(f"codec {enc.codec!r}: malformed encoding (block={block!r}, {B.numel(q)} code bytes and "
                             f"{B.numel(scales)} scales for shape {enc.shape}); the sender and receiver disagree on "
                             "the format")
        dtype = B.compute_dtype(enc.dtype)
        s = Q.from_bf16(scales, dtype)
        if B.is_paddle(q):
            import paddle

            c = Q.unpack_int4(q, n)  # code - 8, in [-8, 7]
            lut = paddle.to_tensor(_LUT.astype(dtype), place=c.place)
            vals = paddle.gather(lut, paddle.cast(c, "int64") + 8)
            return Q.dequantize_blocks(vals, s, block, dtype)
        vals = _byte_lut(dtype)[q.reshape(-1)].reshape(-1)[:n]  # both codes of a byte in one lookup
        return Q.dequantize_blocks(vals, s, block, dtype)


def _pad_codes_numpy(codes: np.ndarray) -> np.ndarray:
    return np.concatenate([codes, np.full(1, -8, np.int8)])  # code 0 (+0.0), read as code - 8


def _pad_codes_paddle(codes: Any) -> Any:
    import paddle

    return paddle.concat([codes, paddle.full([1], -8, dtype="int8")])


_BYTE_LUTS: dict[str, np.ndarray] = {}


def _byte_lut(dtype: str) -> np.ndarray:
    """[256, 2]: the values of the low and the high code of each packed byte."""
    if dtype not in _BYTE_LUTS:
        b = np.arange(256)
        _BYTE_LUTS[dtype] = np.stack([_LUT[b & 15], _LUT[b >> 4]], axis=1).astype(dtype)
    return _BYTE_LUTS[dtype]


def _scale_error(spec: str, x: Any) -> CodecError:
    check_finite(x, spec)  # NaN/Inf get the NonFiniteError; finite values are just too large
    return CodecError(f"codec {spec!r}: a block's max |x| exceeds the bfloat16 scale range (~2e39); send with 'none'")


def _fp4_encode_numpy(x: np.ndarray, block: int, n: int, spec: str) -> tuple[np.ndarray, np.ndarray]:
    flat = x.reshape(-1)
    pad = -n % block
    if pad:
        flat = np.concatenate([flat, np.zeros(pad, flat.dtype)])
    x2 = flat.reshape(-1, block)
    amax = np.abs(x2).max(axis=1)
    if not np.isfinite(amax).all():
        raise _scale_error(spec, x)
    with np.errstate(over="ignore"):
        s6 = (amax / 6).astype(np.float32)  # float64 input: round once to float32 here, as the paddle path does
    try:
        scales = Q.to_bf16(s6)
    except OverflowError:
        raise _scale_error(spec, x) from None
    s = Q.from_bf16(scales, flat.dtype.name)
    s[s == 0] = 1  # an all-zero block: every code is 0 whatever the scale
    t = _thresholds(flat.dtype.name)
    codes = np.empty(n + pad, np.int8)
    c2 = codes.reshape(-1, block)
    step = max(1, _SUB_ROWS // block)

    def work(a: int, b: int) -> None:
        for r0 in range(a, b, step):
            r1 = min(b, r0 + step)
            xs = x2[r0:r1]
            v = np.abs(xs)
            v /= s[r0:r1, None]  # exact and identical to paddle's: IEEE division by the same scale
            np.minimum(v, 6, out=v)  # bf16 rounding may leave the block max a hair above 6
            idx = c2[r0:r1].view(np.uint8)
            idx.fill(0)
            buf = np.empty(v.shape, bool)
            for ti in t:  # seven passes in cache: ~10x faster than np.searchsorted
                np.greater(v, ti, out=buf)
                idx += buf
            np.less(xs, 0, out=buf)
            idx |= buf.view(np.uint8) << 3
            idx -= 8  # code - 8 (wrapping), read as int8: pack_int4 stores values in [-8, 7]

    B.parallel_chunks(work, x2.shape[0])
    return codes[:n], scales


def _fp4_encode_paddle(x: Any, block: int, n: int, spec: str) -> tuple[Any, Any]:
    import paddle

    dtype = B.dtype_name(x)
    flat = paddle.reshape(x, [-1])
    pad = -n % block
    if pad:
        flat = paddle.concat([flat, paddle.zeros([pad], dtype=dtype)])
    x2 = paddle.reshape(flat, [-1, block])
    amax = paddle.max(paddle.abs(x2), axis=1)
    if not bool(paddle.isfinite(amax).all()):
        raise _scale_error(spec, x)
    scales = paddle.cast(paddle.cast(amax / 6, "float32"), "bfloat16")
    s = paddle.cast(scales, dtype)
    if not bool(paddle.isfinite(s).all()):
        raise _scale_error(spec, x)
    s = paddle.where(s > 0, s, paddle.ones_like(s))
    v = paddle.minimum(paddle.abs(x2) / s.unsqueeze(1), paddle.full([], 6, dtype=dtype))
    t = paddle.to_tensor(_thresholds(dtype), place=x.place)
    idx = paddle.searchsorted(t, paddle.reshape(v, [-1]))  # counts thresholds below v: side='left'
    codes = idx + paddle.cast(paddle.reshape(x2, [-1]) < 0, "int64") * 8 - 8
    return paddle.cast(codes[:n] if pad else codes, "int8"), scales


# ---- topk2 ---------------------------------------------------------------------------------------------------


def _low_bits(n: int, k: int) -> int:
    """Elias-Fano low-part width floor(log2(n/k)) (0 when k >= n/2)."""
    return max(0, (n // k).bit_length() - 1)


def _pack_bits(bits: Any) -> Any:
    """Flat 0/1 integers -> bytes, 8 per byte, first bit in the lowest position; zero-padded to whole bytes."""
    if not B.is_paddle(bits):
        return np.packbits(bits.astype(np.uint8, copy=False), bitorder="little")
    import paddle

    b = paddle.cast(paddle.reshape(bits, [-1]), "int32")
    pad = -B.numel(b) % 8
    if pad:
        b = paddle.concat([b, paddle.zeros([pad], dtype="int32")])
    w = paddle.to_tensor(1 << np.arange(8, dtype=np.int32), place=b.place)
    return paddle.cast(paddle.sum(paddle.reshape(b, [-1, 8]) * w, axis=1), "uint8")


def _unpack_bits(p: Any, nbits: int) -> Any:
    """Inverse of _pack_bits: the first nbits bits (numpy uint8 / paddle int64)."""
    if not B.is_paddle(p):
        return np.unpackbits(p.reshape(-1), count=nbits, bitorder="little")
    import paddle

    w = paddle.to_tensor(1 << np.arange(8, dtype=np.int64), place=p.place)
    bits = (paddle.cast(paddle.reshape(p, [-1, 1]), "int64") // w) % 2
    return paddle.reshape(bits, [-1])[:nbits]


def _two_level(a: np.ndarray) -> tuple[np.ndarray, float, float]:
    """Lloyd's 2-level quantizer of magnitudes a (float64): (is_large mask, small mean, large mean)."""
    t = (float(a.min()) + float(a.max())) / 2
    for _ in range(_LLOYD_STEPS):
        hi = a > t
        nh = int(hi.sum())
        if nh in (0, a.size):
            break
        sh = float(a[hi].sum())
        t = ((float(a.sum()) - sh) / (a.size - nh) + sh / nh) / 2
    hi = a > t
    nh = int(hi.sum())
    sh = float(a[hi].sum()) if nh else 0.0
    lo = (float(a.sum()) - sh) / (a.size - nh) if nh < a.size else 0.0
    return hi, lo, sh / nh if nh else 0.0


def _two_level_paddle(a: Any) -> tuple[Any, float, float]:
    import paddle

    total = float(paddle.sum(a))
    t = (float(paddle.min(a)) + float(paddle.max(a))) / 2
    k = B.numel(a)
    for _ in range(_LLOYD_STEPS):
        hi = a > t
        nh = int(paddle.sum(paddle.cast(hi, "int64")))
        if nh in (0, k):
            break
        sh = float(paddle.sum(paddle.where(hi, a, paddle.zeros_like(a))))
        t = ((total - sh) / (k - nh) + sh / nh) / 2
    hi = a > t
    nh = int(paddle.sum(paddle.cast(hi, "int64")))
    sh = float(paddle.sum(paddle.where(hi, a, paddle.zeros_like(a)))) if nh else 0.0
    lo = (total - sh) / (k - nh) if nh < k else 0.0
    return hi, lo, sh / nh if nh else 0.0


@register_codec
class TopK2Codec(FractionArg):
    """Top-k with 2-bit values (SparseLoCo): round(f*n) (at least 1) largest |x| as Elias-Fano indices plus sign and
    magnitude-bucket bits, with two scales per tensor; ~(2 + log2(1/f) + 2)/8 bytes per kept value. Use ef(topk2(f)).
    """

    name = "topk2"
    usage = "topk2(f) with f in (0, 1], the fraction of elements kept, e.g. ef(topk2(0.05))"

    def _encode(self, x: Any) -> Encoded:
        check_finite(x, self.spec)
        n = B.numel(x)
        k = max(1, min(n, int(round(self.fraction * n))))
        idx, val = topk_select(B.reshape(x, (n,)), k)
        L = _low_bits(n, k)
        if B.is_paddle(x):
            import paddle

            idx = paddle.cast(idx, "int64")
            order = paddle.argsort(idx)
            idx, val = paddle.gather(idx, order), paddle.gather(val, order)
            ar = paddle.arange(k, dtype="int64")
            pos = idx // (1 << L) + ar
            upper = paddle.scatter(paddle.zeros([k + ((n - 1) >> L) + 1], "int64"), pos, paddle.ones([k], "int64"))
            low = None
            if L:
                p2 = paddle.to_tensor(1 << np.arange(L, dtype=np.int64), place=idx.place)
                low = (idx.unsqueeze(1) // p2) % 2
            mag = paddle.cast(paddle.abs(val), "float64")
            hi, lo_s, hi_s = _two_level_paddle(mag)
            bits = paddle.stack([paddle.cast(val < 0, "int64"), paddle.cast(hi, "int64")], axis=1)
            scales = np.array([lo_s, hi_s], B.dtype_name(x))
        else:
            idx = idx.astype(np.int64)
            upper = np.zeros(k + ((n - 1) >> L) + 1, np.uint8)
            upper[(idx >> L) + np.arange(k)] = 1
            low = (idx[:, None] >> np.arange(L)) & 1 if L else None
            hi, lo_s, hi_s = _two_level(np.abs(val).astype(np.float64))
            bits = np.stack([val < 0, hi], axis=1)
            scales = np.array([lo_s, hi_s], x.dtype)
        if not np.isfinite(scales).all():  # a mean above the dtype's largest value: only at its very edge
            raise CodecError(f"codec {self.spec!r}: the kept values' mean magnitude overflows {B.dtype_name(x)}; "
                             "send with 'none'")
        if B.is_paddle(x):
            scales = paddle.to_tensor(scales, place=idx.place)
        parts = {"high": _pack_bits(upper)}
        if low is not None:
            parts["low"] = _pack_bits(low)
        parts["bits"] = _pack_bits(bits)
        parts["scales"] = scales
        return Encoded(self.spec, B.dtype_name(x), B.shape_of(x), parts, meta={"k": k, "low": L}, kind=B.kind_of(x))

    def _decode(self, enc: Encoded, parts: dict[str, Any]) -> Any:
        n = int(np.prod(enc.shape, dtype=np.int64))
        k, L = enc.meta.get("k"), enc.meta.get("low")
        ok = isinstance(k, int) and isinstance(L, int) and 1 <= k <= n and L == _low_bits(n, k)
        nu = k + ((n - 1) >> L) + 1 if ok else 0
        if not ok or (B.numel(parts["high"]) != -(-nu // 8) or B.numel(parts["bits"]) != -(-2 * k // 8)
                      or B.numel(parts["scales"]) != 2 or (L > 0) != ("low" in parts)
                      or (L and B.numel(parts["low"]) != -(-k * L // 8))):
            raise CodecError(f"codec {enc.codec!r}: malformed encoding (k={k!r}, low={L!r} for shape {enc.shape}); "
                             "the frames are corrupted or from another format")
        dtype = B.compute_dtype(enc.dtype)
        upper = _unpack_bits(parts["high"], nu)
        if B.is_paddle(upper):
            import paddle

            pos = paddle.reshape(paddle.nonzero(upper), [-1])
            if B.numel(pos) != k:
                raise CodecError(f"codec {enc.codec!r}: {B.numel(pos)} index entries for k={k}; the frames are corrupted")
            idx = (pos - paddle.arange(k, dtype="int64")) * (1 << L)
            if L:
                p2 = paddle.to_tensor(1 << np.arange(L, dtype=np.int64), place=pos.place)
                idx = idx + paddle.sum(paddle.reshape(_unpack_bits(parts["low"], k * L), [k, L]) * p2, axis=1)
            bits = paddle.reshape(_unpack_bits(parts["bits"], 2 * k), [k, 2])
            s = paddle.cast(parts["scales"], dtype)
            val = paddle.gather(s, bits[:, 1]) * paddle.cast(1 - 2 * bits[:, 0], dtype)
            return topk_scatter(idx, val, n, dtype)
        pos = np.flatnonzero(upper)
        if pos.size != k:
            raise CodecError(f"codec {enc.codec!r}: {pos.size} index entries for k={k}; the frames are corrupted")
        idx = (pos - np.arange(k)) << L
        if L:
            idx |= (_unpack_bits(parts["low"], k * L).reshape(k, L).astype(np.int64) << np.arange(L)).sum(axis=1)
        if int(idx[-1]) >= n:
            raise CodecError(f"codec {enc.codec!r}: an index lies outside [0, {n}); the frames are corrupted")
        bits = _unpack_bits(parts["bits"], 2 * k).reshape(k, 2)
        val = parts["scales"].astype(dtype)[bits[:, 1]] * (1 - 2 * bits[:, 0].astype(dtype))
        return topk_scatter(idx, val, n, dtype)
