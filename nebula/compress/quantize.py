"""Pure quantization math on numpy arrays and paddle.Tensors: FP16/BF16 casts, symmetric absmax INT8/INT4 by block."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import backend as B

__all__ = [
    "FP16_MAX", "to_fp16", "from_fp16", "to_bf16", "from_bf16", "quantize_blocks", "dequantize_blocks",
    "pack_int4", "unpack_int4",
]

FP16_MAX = 65504.0
_FP16_OVERFLOW = 65520.0  # values at or above this round to Inf in FP16
_SUB = 1 << 15  # elements per inner step: temporaries stay in the L2 cache


def _sub_ranges(a: int, b: int, step: int = _SUB):
    for s in range(a, b, step):
        yield s, min(b, s + step)


# Rebias the exponent so that 2^-14 (the smallest normal FP16) maps to 0 and anything smaller wraps to a huge
# value; 0xFFF (+1 if odd) rounds the 13 dropped bits to nearest even; 1 << 10 is added back after the shift.
_F16_MAGIC_ADD = np.uint32((0xFFF - (113 << 23)) & 0xFFFFFFFF)
_F16_DENORM = np.uint32(((127 - 15) + (23 - 10) + 1) << 23)  # adding this float aligns FP16 subnormals
_F16_DENORM_F = np.array([_F16_DENORM], np.uint32).view(np.float32)[0]
_F16_OVERFLOW_BITS = np.uint32(0x477FF000)  # 65520.0: rounds to Inf in FP16 (NaN/Inf bits are larger still)
_F16_TABLE: np.ndarray | None = None


def _f16_table() -> np.ndarray:
    global _F16_TABLE
    if _F16_TABLE is None:  # every FP16 bit pattern as FP32: 256 KiB, stays in cache
        _F16_TABLE = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
    return _F16_TABLE


def _f32_bits_to_f16(u: np.ndarray, out: np.ndarray) -> int:
    """IEEE round-to-nearest-even FP32 -> FP16 on bit patterns (vectorised; numpy's cast is scalar here).

    Returns the largest |x| bit pattern so the caller can reject NaN/Inf/overflow without another pass.
    """
    a = np.bitwise_and(u, np.uint32(0x7FFFFFFF))
    top = int(a.max()) if a.size else 0
    sub = np.add(a.view(np.float32), _F16_DENORM_F).view(np.uint32)
    np.subtract(sub, _F16_DENORM, out=sub)
    r = np.right_shift(a, 13)
    np.bitwise_and(r, np.uint32(1), out=r)
    np.add(r, _F16_MAGIC_ADD, out=r)
    np.add(a, r, out=a)
    np.right_shift(a, 13, out=a)
    np.add(a, np.uint32(1 << 10), out=a)
    # Below 2^-14 the normal path wrapped to >= 399 << 10 while the subnormal path gives <= 1 << 10; from 2^-14 up
    # both paths agree on [2^-14, 2^-13) and the subnormal one only grows faster: the minimum is the right one.
    np.minimum(a, sub, out=a)
    np.right_shift(u, 16, out=r)
    np.bitwise_and(r, np.uint32(0x8000), out=r)
    np.bitwise_or(a, r, out=a)
    np.copyto(out, a, casting="unsafe")
    return top


def to_fp16(x: Any) -> Any:
    """Cast a float tensor to FP16 (round to nearest even); raises OverflowError for NaN, Inf or |x| >= 65520."""
    if B.is_paddle(x):
        import paddle

        amax = float(paddle.max(paddle.abs(x)))
        if not amax < _FP16_OVERFLOW:
            raise OverflowError(f"max |x| = {amax:.6g} is outside the FP16 range ({FP16_MAX})")
        return B.cast(x, "float16")
    flat = x.reshape(-1)
    if flat.dtype != np.float32:
        flat = flat.astype(np.float32)
    u = flat.view(np.uint32)
    out = np.empty(flat.shape, np.uint16)
    tops: list[int] = []

    def work(a: int, b: int) -> None:
        top = 0
        for s, e in _sub_ranges(a, b):
            top = max(top, _f32_bits_to_f16(u[s:e], out[s:e]))
        tops.append(top)

    B.parallel_chunks(work, flat.size)
    top = max(tops, default=0)
    if top >= _F16_OVERFLOW_BITS:
        amax = np.array([top], np.uint32).view(np.float32)[0]
        raise OverflowError(f"max |x| = {amax:.6g} is outside the FP16 range ({FP16_MAX})")
    return out.view(np.float16).reshape(x.shape)


def from_fp16(h: Any, dtype: str) -> Any:
    """Widen an FP16 tensor to `dtype` (numpy: a table lookup, faster than numpy's scalar cast)."""
    if B.is_paddle(h):
        return B.cast(h, dtype)
    flat = h.reshape(-1).view(np.uint16)
    out = np.empty(flat.shape, np.float32)
    table = _f16_table()

    def work(a: int, b: int) -> None:
        for s, e in _sub_ranges(a, b):
            np.take(table, flat[s:e], out=out[s:e])

    B.parallel_chunks(work, flat.size)
    return out.reshape(h.shape).astype(dtype, copy=False)


def to_bf16(x: Any) -> Any:
    """Round a float tensor to BF16 (nearest even); numpy returns the uint16 bit patterns.

    Raises OverflowError for NaN/Inf or values that round to Inf (checked in the same pass).
    """
    if B.is_paddle(x):
        return B.cast(x, "bfloat16")
    flat = x.reshape(-1)
    out = np.empty(flat.shape, np.uint16)
    tops: list[int] = []

    def work(a: int, b: int) -> None:
        top = 0
        for s, e in _sub_ranges(a, b):
            u = flat[s:e].astype(np.float32, copy=False).view(np.uint32)
            if u.size:
                top = max(top, int(np.bitwise_and(u, np.uint32(0x7FFFFFFF)).max()))
            r = (u >> 16) & 1
            r += 0x7FFF
            r += u
            r >>= 16
            np.copyto(out[s:e], r, casting="unsafe")
        tops.append(top)

    B.parallel_chunks(work, flat.size)
    if max(tops, default=0) >= 0x7F7F8000:  # rounds to Inf in BF16, or is already NaN/Inf
        raise OverflowError("input holds NaN/Inf or values beyond the BF16 range")
    return out.reshape(x.shape)


def from_bf16(b: Any, dtype: str) -> Any:
    """Widen BF16 (paddle tensor, or numpy uint16 bit patterns) to `dtype`."""
    if B.is_paddle(b):
        return B.cast(b, dtype)
    flat = b.reshape(-1).view(np.uint16)
    out = np.empty(flat.shape, np.float32)
    out_u = out.view(np.uint32)

    def work(a: int, c: int) -> None:
        np.left_shift(flat[a:c], 16, out=out_u[a:c], dtype=np.uint32)

    B.parallel_chunks(work, flat.size)
    return out.reshape(b.shape).astype(dtype, copy=False)


def quantize_blocks(x: Any, block: int, levels: int) -> tuple[Any, Any]:
    """Symmetric absmax quantization of flat x in blocks of `block` elements (the last may be shorter).

    Returns (q: int8 in [-levels, levels], scales: float32, one per block) with x ~= q * scale, |error| <= scale/2.
    Non-finite input gives non-finite scales, which the caller reports.
    """
    n = B.numel(x)
    if B.is_paddle(x):
        return _quantize_blocks_paddle(x, block, levels, n)
    x = x.reshape(-1)
    nfull, tail = divmod(n, block)
    q = np.empty(n, np.int8)
    scales = np.empty(nfull + (tail > 0), np.float32)
    if nfull == 1 and tail == 0:
        amax = float(max(x.max(), -x.min()))
        scales[0] = amax / levels
        inv = levels / amax if amax > 0 else 0.0
        if math.isfinite(amax):
            _scale_round(x, inv, q)
        return q, scales
    if nfull:
        _quantize_rows(x[: nfull * block].reshape(nfull, block), q[: nfull * block].reshape(nfull, block),
                       scales[:nfull], levels)
    if tail:
        _quantize_rows(x[nfull * block:].reshape(1, tail), q[nfull * block:].reshape(1, tail), scales[nfull:], levels)
    return q, scales


def _scale_round(x: np.ndarray, inv: float, q: np.ndarray) -> None:
    with np.errstate(over="ignore"):
        inv_t = x.dtype.type(inv)
    if not np.isfinite(inv_t):  # max|x| so tiny that its inverse overflows: rescale in float64 instead
        np.copyto(q, np.rint(x.astype(np.float64) * inv), casting="unsafe")
        return

    def work(a: int, b: int) -> None:
        for s, e in _sub_ranges(a, b):
            t = x[s:e] * inv_t
            np.rint(t, out=t)
            np.copyto(q[s:e], t, casting="unsafe")

    B.parallel_chunks(work, x.size)


def _quantize_rows(x2: np.ndarray, q2: np.ndarray, scales: np.ndarray, levels: int) -> None:
    rows, width = x2.shape
    step = max(1, _SUB // width)

    def work(a: int, b: int) -> None:
        for s, e in _sub_ranges(a, b, step):
            xs = x2[s:e]
            amax = np.abs(xs).max(axis=1)  # one reduction over short rows beats max and min
            scales[s:e] = amax / levels
            if not np.isfinite(amax).all():
                return  # the caller sees the non-finite scale and reports it
            inv = np.divide(levels, amax, out=np.zeros(amax.shape), where=amax > 0)  # float64: no overflow
            with np.errstate(over="ignore"):
                inv_t = inv.astype(xs.dtype)
            t = xs * inv_t[:, None] if np.isfinite(inv_t).all() else xs * inv[:, None]
            np.rint(t, out=t)
            np.copyto(q2[s:e], t, casting="unsafe")

    B.parallel_chunks(work, rows)


def _quantize_blocks_paddle(x: Any, block: int, levels: int, n: int) -> tuple[Any, Any]:
    import paddle

    flat = paddle.reshape(x, [-1])
    nfull, tail = divmod(n, block)
    if tail:
        flat = paddle.concat([flat, paddle.zeros([block - tail], dtype=flat.dtype)])
    x2 = paddle.reshape(flat, [-1, block])
    amax = paddle.max(paddle.abs(x2), axis=1)
    inv = paddle.where(amax > 0, levels / paddle.where(amax > 0, amax, paddle.ones_like(amax)), paddle.zeros_like(amax))
    q = paddle.cast(paddle.round(x2 * inv.unsqueeze(1)), "int8")
    q = paddle.reshape(q, [-1])[:n] if tail else paddle.reshape(q, [-1])
    return q, paddle.cast(amax / levels, "float32")


def dequantize_blocks(q: Any, scales: Any, block: int, dtype: str) -> Any:
    """Inverse of quantize_blocks: q * scale per block, as a flat tensor of `dtype`."""
    n = B.numel(q)
    if B.is_paddle(q):
        import paddle

        nfull, tail = divmod(n, block)
        qf = paddle.cast(q, dtype)
        if tail:
            qf = paddle.concat([qf, paddle.zeros([block - tail], dtype=dtype)])
        y = paddle.reshape(qf, [-1, block]) * paddle.cast(scales, dtype).unsqueeze(1)
        return paddle.reshape(y, [-1])[:n]
    q = q.reshape(-1)
    out = np.empty(n, dtype)
    nfull, tail = divmod(n, block)
    sc = scales.astype(dtype, copy=False)
    if nfull == 1 and tail == 0:
        s0 = sc[0]

        def work(a: int, b: int) -> None:
            np.multiply(q[a:b], s0, out=out[a:b])

        B.parallel_chunks(work, n)
        return out
    if nfull:
        q2 = q[: nfull * block].reshape(nfull, block)
        o2 = out[: nfull * block].reshape(nfull, block)

        def work_rows(a: int, b: int) -> None:
            for s, e in _sub_ranges(a, b, max(1, _SUB // block)):
                np.multiply(q2[s:e], sc[s:e, None], out=o2[s:e])

        B.parallel_chunks(work_rows, nfull)
    if tail:
        np.multiply(q[nfull * block:], sc[nfull], out=out[nfull * block:])
    return out


def pack_int4(q: Any) -> Any:
    """Pack int8 values in [-8, 7] two per byte (low nibble first); odd lengths get a zero nibble of padding."""
    n = B.numel(q)
    if B.is_paddle(q):
        import paddle

        u = paddle.cast(paddle.reshape(q, [-1]), "int32") + 8
        if n % 2:
            u = paddle.concat([u, paddle.full([1], 8, dtype="int32")])
        return paddle.cast(u[0::2] + u[1::2] * 16, "uint8")
    u = q.reshape(-1).view(np.uint8) + np.uint8(8)
    u &= 0x0F
    if n % 2:
        u = np.concatenate([u, np.zeros(1, np.uint8)])
    out = u[0::2]
    out |= u[1::2] << 4
    return np.ascontiguousarray(out)


def unpack_int4(p: Any, n: int) -> Any:
    """Inverse of pack_int4: n int8 values in [-8, 7]."""
    if B.is_paddle(p):
        import paddle

        v = paddle.cast(p, "int32")
        both = paddle.stack([v % 16, v // 16], axis=1)
        return paddle.cast(paddle.reshape(both, [-1])[:n] - 8, "int8")
    both = np.empty((p.size, 2), np.uint8)
    np.bitwise_and(p, 0x0F, out=both[:, 0])
    np.right_shift(p, 4, out=both[:, 1])
    return (both.reshape(-1)[:n].view(np.int8) - np.int8(8)).astype(np.int8, copy=False)
