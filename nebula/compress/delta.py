"""Activation deltas (AQ-SGD, Wang et al. 2022): each sample's activation is sent as a low-bit delta against what both
ends of a pipeline boundary already hold for that sample.

`delta(inner, first=int8_block, cache_mb=64)` is a keyed, two-sided codec. The sender encodes a batch with the
sample id of each row (`encode_keyed(x, ids)`): a row whose sample is in its cache goes as inner(x - m) against the
cached m, a row seen for the first time (or evicted since) as first(x); then it stores, for every row, what the
receiver will decode, so both caches stay equal. The receiver (`decode` on its own instance) decodes with the ids the
message carries and updates its cache the same way. Each cache is bounded (`cache_mb` MiB, least recently sent
sample evicted first); both ends evict identically because they see the same messages in the same order.

The wire carries, per row, the sample id and the cache generation the delta is against (0: sent with `first`); a
receiver whose entry differs (a lost message, a restart on one side) refuses the message with one line instead of
decoding garbage. After a recovery both ends drop their caches (the runtime opens new boundaries, with new codec
instances), so each sample is sent with `first` again.

`int2_block(block=64)` is the low-bit inner codec: 2 bits per element (four levels ±0.5, ±1.5 of max|block|/1.5)
plus an FP32 scale per block, 0.3125 bytes per element at block 64.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import backend as B
from .base import (Codec, CodecError, ElementCodec, Encoded, check_finite, codec_from_node, decode_encoded, parse_args,
                   raw_encoded, register_codec)
from .integer import BlockArgs
from .spec import SpecError, SpecNode, format_spec, parse_spec

__all__ = ["Int2BlockCodec", "DeltaCodec", "SampleCache", "CacheEntry", "DesyncError", "quantize2", "dequantize2",
           "is_keyed"]


# -- 2-bit block quantisation (pure) --------------------------------------------------------------------------------
def quantize2(x: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """(packed codes, FP32 scales) of flat `x`: per block of `block` values, code c in 0..3 stands for
    (c - 1.5) * max|block| / 1.5; four codes per byte, the first in the low bits."""
    n = x.size
    nb = -(-n // block)
    padded = np.zeros(nb * block, np.float32)
    padded[:n] = x.reshape(-1)
    blocks = padded.reshape(nb, block)
    scales = np.maximum(blocks.max(axis=1), -blocks.min(axis=1)).astype(np.float32)
    step = scales / 1.5
    inv = np.divide(1.0, step, out=np.zeros_like(step), where=step > 0)
    blocks *= inv[:, None]  # (in place: `padded` is this function's own copy)
    blocks += 2.0
    np.floor(blocks, out=blocks)
    np.clip(blocks, 0, 3, out=blocks)
    codes = blocks.astype(np.uint8).reshape(-1)
    pad = (-codes.size) % 4
    if pad:
        codes = np.concatenate([codes, np.zeros(pad, np.uint8)])
    c = codes.reshape(-1, 4)
    packed = c[:, 0] | (c[:, 1] << 2) | (c[:, 2] << 4) | (c[:, 3] << 6)
    return np.ascontiguousarray(packed), scales


def dequantize2(packed: np.ndarray, scales: np.ndarray, block: int, n: int) -> np.ndarray:
    """Inverse of quantize2: `n` float32 values."""
    p = np.asarray(packed, np.uint8).reshape(-1)
    nb = np.asarray(scales).size
    if 4 * p.size < nb * block or nb * block < n:
        raise CodecError(f"codec int2_block({block}): malformed encoding ({4 * p.size} codes, {nb} scales for {n} "
                         "values); the sender and receiver disagree on the format")
    vals = _LEVELS[p].reshape(-1)[:nb * block].reshape(nb, block)  # four levels per byte, by table
    vals *= np.asarray(scales, np.float32)[:, None] / 1.5
    return vals.reshape(-1)[:n]


# the four levels (code - 1.5) of each of a byte's four codes, low bits first: one table lookup per byte
_LEVELS = (np.stack([(np.arange(256) >> s) & 3 for s in (0, 2, 4, 6)], axis=1) - 1.5).astype(np.float32)


@register_codec
class Int2BlockCodec(BlockArgs, ElementCodec):
    """2-bit codes per element with one FP32 absmax scale per `block` values (default 64): |error| <=
    max|block| / 3; 0.3125 bytes per element. Meant for deltas (`delta(int2_block)`), whose errors do not add up."""

    name = "int2_block"
    usage = "int2_block, int2_block(block=64) or int2_block(inner, block=64); block in 1..2^24"
    default_block = 64

    def _encode_leaf(self, x: Any) -> Encoded:
        kind = B.kind_of(x)
        h = B.to_host(x) if B.is_paddle(x) else x
        check_finite(h, self.spec)
        block = max(1, min(self.block, h.size))
        q, scales = quantize2(h.astype(np.float32, copy=False), block)
        if kind == "paddle":
            q, scales = B.from_host(q, "uint8", kind), B.from_host(scales, "float32", kind)
        return Encoded(self.leaf_spec, B.dtype_name(x), B.shape_of(x), {"q": q, "scales": scales},
                       meta={"block": block}, kind=kind)

    def _decode(self, enc: Encoded, parts: dict[str, Any]) -> Any:
        block = enc.meta.get("block")
        if not isinstance(block, int) or block < 1:
            raise CodecError(f"codec {enc.codec!r}: malformed encoding (block={block!r}); the sender and receiver "
                             "disagree on the format")
        n = int(np.prod(enc.shape, dtype=np.int64))
        q, scales = (B.to_host(p) if B.is_paddle(p) else p for p in (parts["q"], parts["scales"]))
        y = dequantize2(q, scales, block, n).astype(B.compute_dtype(enc.dtype), copy=False)
        return B.from_host(y, B.compute_dtype(enc.dtype), "paddle") if enc.kind == "paddle" else y


# -- the per-sample cache --------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class CacheEntry:
    """What both ends hold for one sample: the decoded activation and how often it was updated (1 = first sight)."""

    gen: int
    row: np.ndarray


class SampleCache:
    """Decoded activations by sample id, at most `max_bytes` of them: the least recently stored goes first."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"cache bound {max_bytes} bytes must be >= 0")
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._rows: OrderedDict[int, CacheEntry] = OrderedDict()
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._rows)

    def get(self, sample: int) -> CacheEntry | None:
        """The entry of `sample` (None when absent); does not change the eviction order."""
        return self._rows.get(sample)

    def put(self, sample: int, row: np.ndarray) -> None:
        """Store `row` for `sample` (its generation one more than before), then evict down to the bound."""
        old = self._rows.pop(sample, None)
        if old is not None:
            self.nbytes -= old.row.nbytes
        self._rows[sample] = CacheEntry((old.gen if old else 0) + 1, row)
        self.nbytes += row.nbytes
        while self.nbytes > self.max_bytes and self._rows:
            _, gone = self._rows.popitem(last=False)
            self.nbytes -= gone.row.nbytes
            self.evictions += 1

    def clear(self) -> None:
        """Forget every sample (after a recovery: the peer may hold other entries)."""
        self._rows.clear()
        self.nbytes = 0


class DesyncError(CodecError):
    """A delta message does not fit this end's cache: the two ends' caches are out of step."""


def _references(cache: SampleCache, ids: np.ndarray, row_shape: tuple[int, ...]) -> tuple[np.ndarray, list]:
    """Per row, the cache generation to send against (0: send with `first`) and the cached rows (None for first)."""
    gens = np.zeros(len(ids), np.int32)
    refs: list = []
    for i, s in enumerate(ids.tolist()):
        e = cache.get(s)
        if e is not None and e.row.shape == row_shape:
            gens[i] = e.gen
            refs.append(e.row)
        else:
            refs.append(None)
    return gens, refs


def _rebuild(first_rows: np.ndarray | None, delta_rows: np.ndarray | None, gens: np.ndarray, refs: list,
             row_shape: tuple[int, ...]) -> np.ndarray:
    """The decoded batch: `first` rows as decoded, delta rows as their reference plus the decoded delta (pure)."""
    out = np.empty((len(gens),) + row_shape, np.float32)
    is_first = gens == 0
    if first_rows is not None:
        out[is_first] = first_rows
    if delta_rows is not None:
        out[~is_first] = np.stack([r for r, f in zip(refs, is_first) if not f]) + delta_rows
    return out


def _store(cache: SampleCache, ids: np.ndarray, rows: np.ndarray) -> None:
    """Every row of a message into the cache, in row order (both ends call this with the same arguments)."""
    for s, row in zip(ids.tolist(), rows):
        cache.put(s, np.array(row, np.float32))


def is_keyed(codec: Codec) -> bool:
    """True for a codec that needs each row's sample id (`encode_keyed`) and a stateful receiver."""
    return bool(getattr(codec, "keyed", False))


def _is_codec(v: Any) -> bool:
    return isinstance(v, SpecNode)


def _is_mb(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 1 << 20


@register_codec
class DeltaCodec(Codec):
    """AQ-SGD activation deltas against a per-sample cache on both ends (see the module docstring)."""

    name = "delta"
    keyed = True
    usage = ("delta(inner, first=int8_block, cache_mb=64): inner codes each row's delta against the cached sample, "
             "first codes a sample not in the cache, cache_mb (> 0) bounds each end's cache; e.g. "
             "delta(int2_block, first=int8_block, cache_mb=64)")

    def __init__(self, inner: Codec, first: Codec, cache_mb: float = 64) -> None:
        for what, c in (("inner", inner), ("first", first)):
            if is_keyed(c):
                raise SpecError(f"codec delta: {what} codec {c.spec!r} cannot be keyed or stateful; usage: "
                                f"{self.usage}")
        self.inner, self.first, self.cache_mb = inner, first, cache_mb
        self.cache = SampleCache(int(cache_mb * (1 << 20)))
        self._spec = format_spec(SpecNode("delta", (parse_spec(inner.spec),),
                                          (("first", parse_spec(first.spec)), ("cache_mb", cache_mb))))

    @property
    def spec(self) -> str:
        return self._spec

    @classmethod
    def from_spec(cls, node: SpecNode) -> "DeltaCodec":
        if len(node.args) != 1 or not isinstance(node.args[0], SpecNode):
            raise SpecError(f"codec {format_spec(node)!r}: takes exactly one inner codec; usage: {cls.usage}")
        args = parse_args(SpecNode(node.name, (), node.kwargs), (), {"first": _is_codec, "cache_mb": _is_mb},
                          cls.usage)
        inner = codec_from_node(node.args[0])
        first = codec_from_node(args["first"]) if "first" in args else codec_from_node(parse_spec("int8_block"))
        return cls(inner, first, args.get("cache_mb", 64))

    def reset(self) -> None:
        """Drop this end's cache (both ends must: after a recovery every sample goes with `first` again)."""
        self.cache.clear()

    # -- sender ------------------------------------------------------------------------------------------------
    def encode(self, x: Any) -> Encoded:
        raise CodecError(f"codec {self.spec!r} needs the sample id of each row: send activations through a pipeline "
                         "boundary (forward) or call encode_keyed(x, ids); gradients cannot use it (set "
                         "compression.backward to a codec without delta)")

    def encode_keyed(self, x: Any, ids: Any) -> Encoded:
        """Encode batch `x` (rows along axis 0) whose row i is sample ids[i]; updates this end's cache."""
        ids = _check_ids(ids, B.shape_of(x), self.spec)
        kind, dt = B.kind_of(x), B.dtype_name(x)
        h = B.to_host(x) if B.is_paddle(x) else np.asarray(x)
        if not B.is_float_dtype(dt) or h.size == 0:
            return raw_encoded(x, self.spec)
        h = h.astype(np.float32, copy=False)
        check_finite(h, self.spec)
        row_shape = tuple(h.shape[1:])
        gens, refs = _references(self.cache, ids, row_shape)
        is_first = gens == 0
        parts: dict[str, Any] = {"ids": ids, "gen": gens}
        first_rows = delta_rows = None
        if is_first.any():
            enc = self.first.encode(np.ascontiguousarray(h[is_first]))
            parts["first"] = enc
            first_rows = np.asarray(decode_encoded(enc), np.float32)
        if (~is_first).any():
            ref = np.stack([r for r, f in zip(refs, is_first) if not f])
            enc = self.inner.encode(np.ascontiguousarray(h[~is_first] - ref))
            parts["delta"] = enc
            delta_rows = np.asarray(decode_encoded(enc), np.float32)
        _store(self.cache, ids, _rebuild(first_rows, delta_rows, gens, refs, row_shape))
        return Encoded(self.spec, dt, B.shape_of(x), parts, kind=kind, spec=self.spec)

    # -- receiver ----------------------------------------------------------------------------------------------
    def decode(self, enc: Encoded) -> Any:
        """Decode a message of the peer's instance with this end's cache (updated as the sender's was)."""
        if enc.codec == "none":
            return decode_encoded(enc)
        if enc.codec != self.spec:
            raise DesyncError(f"codec {self.spec!r}: the message was encoded with {enc.codec!r}; both ends must use "
                              "the same delta spec (compression.forward of the same job file)")
        ids = _check_ids(enc.parts.get("ids"), enc.shape, self.spec)
        gens = enc.parts.get("gen")
        gens = B.to_host(gens) if B.is_paddle(gens) else gens
        if not isinstance(gens, np.ndarray) or gens.dtype != np.int32 or gens.shape != ids.shape or (gens < 0).any():
            raise DesyncError(f"codec {self.spec!r}: malformed message (per-row generations missing or of the wrong "
                              "shape); the sender is not a delta codec of this version")
        row_shape = tuple(enc.shape[1:])
        is_first = gens == 0
        refs: list = []
        for s, g in zip(ids.tolist(), gens.tolist()):
            e = self.cache.get(s)
            if g == 0:
                refs.append(None)
            elif e is None or e.gen != g or e.row.shape != row_shape:
                have = "no entry" if e is None else f"generation {e.gen}"
                raise DesyncError(f"codec {self.spec!r}: sample {s} is sent as a delta against cache generation {g} "
                                  f"but this end holds {have}; the two ends' caches are out of step (a message lost "
                                  "or one end restarted): restart both ends of the boundary, which drops both caches")
            else:
                refs.append(e.row)
        first_rows = _part_rows(enc, "first", int(is_first.sum()), row_shape, self.spec)
        delta_rows = _part_rows(enc, "delta", int((~is_first).sum()), row_shape, self.spec)
        out = _rebuild(first_rows, delta_rows, gens, refs, row_shape)
        _store(self.cache, ids, out)
        if enc.kind == "paddle":  # (float32 on the device, then the sender's dtype)
            return B.cast(B.from_host(out, "float32", "paddle"), enc.dtype)
        return out if enc.dtype == "bfloat16" else out.astype(enc.dtype, copy=False)  # (numpy has no bfloat16)

    def _encode(self, x: Any) -> Encoded:  # (encode is overridden: never called)
        raise CodecError(f"codec {self.spec!r}: use encode_keyed(x, ids)")

    def _decode(self, enc: Encoded, parts: dict[str, Any]) -> Any:
        raise CodecError(f"codec {enc.codec!r}: a delta message decodes only with the receiving end's cache (a "
                         "DeltaCodec instance per boundary), not statelessly")

    @property
    def cache_bytes(self) -> int:
        """Bytes this end's cache holds now (at most cache_mb MiB)."""
        return self.cache.nbytes


def _check_ids(ids: Any, shape: tuple[int, ...], spec: str) -> np.ndarray:
    """Sample ids as a contiguous int64 vector, one per row of a tensor of `shape`."""
    if B.is_paddle(ids):
        ids = B.to_host(ids)
    if not isinstance(ids, np.ndarray) or ids.ndim != 1 or ids.dtype.kind not in "iu":
        raise DesyncError(f"codec {spec!r}: sample ids must be a 1-D integer array, got "
                          f"{getattr(ids, 'dtype', type(ids).__name__)}")
    if not shape or ids.shape[0] != shape[0]:
        raise DesyncError(f"codec {spec!r}: {ids.shape[0]} sample ids for a tensor of shape {list(shape)}; pass one "
                          "id per row (axis 0)")
    # (an id may repeat: a step that spans two epochs of a small set; each such row goes against the same entry,
    # and the entry is stored row by row, on both ends alike)
    return np.ascontiguousarray(ids, np.int64)


def _part_rows(enc: Encoded, name: str, count: int, row_shape: tuple[int, ...], spec: str) -> np.ndarray | None:
    """The decoded rows of part `name` (None when no row uses it), checked against the row count."""
    part = enc.parts.get(name)
    if count == 0:
        if part is not None:
            raise DesyncError(f"codec {spec!r}: malformed message (a {name!r} part with no rows for it)")
        return None
    if not isinstance(part, Encoded):
        raise DesyncError(f"codec {spec!r}: malformed message ({count} rows need a {name!r} part, none came)")
    rows = decode_encoded(part)
    rows = B.to_host(rows) if B.is_paddle(rows) else rows
    if tuple(rows.shape) != (count,) + row_shape:
        raise DesyncError(f"codec {spec!r}: malformed message ({name!r} part of shape {list(rows.shape)} for {count} "
                          f"rows of {list(row_shape)})")
    return np.asarray(rows, np.float32)
