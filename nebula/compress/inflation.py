"""Warn when a codec sends more than the raw tensor (or a nested codec more than its outer codec alone) at a shape."""
from __future__ import annotations

import logging
import math
import threading
from typing import Any, Callable

from . import backend as B
from . import factorize as F
from .encoded import raw_encoded
from .spec import SpecError, SpecNode, format_spec, parse_spec

__all__ = ["check_inflation", "svd_break_even_ratio", "smaller_alternatives", "forget_warnings"]

log = logging.getLogger("nebula.compress")

_FACTOR_CODECS = ("svd", "lowrank")
_WRAPPERS = ("ef", "auto", "huffman")  # their inner codec is what is sent: there is no outer codec to compare with
_MAX_SEEN = 4096  # (spec, shape, dtype) keys already checked; bounded so a job with ever-new shapes cannot grow it
_seen: set[tuple[str, tuple[int, ...], str]] = set()
_lock = threading.Lock()
_busy = threading.local()  # set while alternatives are encoded: their own checks would only repeat this one


def svd_break_even_ratio(shape: tuple[int, ...]) -> float | None:
    """Largest svd(r) ratio whose factors k(m+n+1) hold fewer values than the [m, n] matrix (None: no such r)."""
    m, n = F.matrix_shape(tuple(shape))
    full = min(m, n)
    k = (m * n - 1) // (m + n + 1)  # the largest k with k(m+n+1) < m*n
    k = min(k, full)
    if k < 1:
        return None
    r = math.floor(100 * k / full) / 100  # a short ratio to quote; keep_count rounds, so check it below
    while r > 0 and F.keep_count(r, m, n) > k:  # keep_count rounds: step down until it keeps at most k values
        r = round(r - 0.01, 2)
    return r if r > 0 else None


def _strip_factor(node: SpecNode) -> SpecNode | None:
    """The element codec of `node` without its low-rank inner codec (fp16(svd(0.6)) -> fp16), or None."""
    inner = [a for a in node.args if isinstance(a, SpecNode)]
    if node.name in _WRAPPERS or not inner or parse_spec(format_spec(inner[0])).name not in _FACTOR_CODECS:
        return None
    return SpecNode(node.name, tuple(a for a in node.args if not isinstance(a, SpecNode)), node.kwargs)


def _with_ratio(node: SpecNode, ratio: float) -> SpecNode:
    """`node` with every svd(r) in it replaced by svd(ratio)."""
    if node.name == "svd":
        return SpecNode("svd", (ratio,))
    return SpecNode(node.name, tuple(_with_ratio(a, ratio) if isinstance(a, SpecNode) else a for a in node.args),
                    node.kwargs)


def _contains_svd(node: SpecNode) -> bool:
    return node.name == "svd" or any(isinstance(a, SpecNode) and _contains_svd(a) for a in node.args)


def smaller_alternatives(spec: str, shape: tuple[int, ...]) -> list[str]:
    """Specs to suggest instead of `spec` at `shape`, most similar first (the caller keeps those that are smaller)."""
    try:
        node = parse_spec(spec)
    except SpecError:
        return ["fp16", "none"]
    out: list[str] = []
    if _contains_svd(node):
        r = svd_break_even_ratio(shape)
        if r is not None:
            out.append(format_spec(_with_ratio(node, r)))
    outer = _strip_factor(node)
    if outer is not None:
        out.append(format_spec(outer))
    out += [s for s in ("fp16", "none") if s != spec]
    return list(dict.fromkeys(out))


def forget_warnings() -> None:
    """Check every (codec, shape) again (tests; a job that changes its codecs)."""
    with _lock:
        _seen.clear()


def check_inflation(spec: str, x: Any, nbytes: int, codec_of: Callable[[str], Any]) -> bool:
    """Warn once per (codec, shape, dtype) when `nbytes` exceeds what `none` sends, or what the nested codec's outer
    codec alone sends; the warning names the codec, the shape and a smaller alternative. True when it warned."""
    if getattr(_busy, "on", False):
        return False
    shape, dtype = B.shape_of(x), B.dtype_name(x)
    key = (spec, shape, dtype)
    with _lock:
        if key in _seen:
            return False
        if len(_seen) >= _MAX_SEEN:
            _seen.clear()
        _seen.add(key)
    _busy.on = True
    try:
        return _check(spec, x, nbytes, shape, dtype, codec_of)
    finally:
        _busy.on = False


def _check(spec: str, x: Any, nbytes: int, shape: tuple[int, ...], dtype: str,
           get_codec: Callable[[str], Any]) -> bool:

    raw = raw_encoded(x).nbytes
    node = parse_spec(spec)
    outer = _strip_factor(node)
    limit, than = raw, f"the raw tensor ({raw:,} bytes with 'none')"
    if nbytes <= raw and outer is not None:
        outer_bytes = get_codec(format_spec(outer)).encode(x).nbytes
        if nbytes > outer_bytes:
            limit, than = outer_bytes, f"{format_spec(outer)!r} alone ({outer_bytes:,} bytes)"
    if nbytes <= limit:
        return False
    sizes = [(alt, raw if alt == "none" else get_codec(alt).encode(x).nbytes)
             for alt in smaller_alternatives(spec, shape)]
    best = next((a for a in sizes if a[1] <= limit), None) or next((a for a in sizes if a[1] < nbytes), None)
    hint = f"use {best[0]!r} ({best[1]:,} bytes) at this shape" if best else "use 'none'"
    log.warning("codec %r at shape %s (%s) sends %s bytes, more than %s; %s",
                spec, list(shape), dtype, f"{nbytes:,}", than, hint)
    return True
