"""The C allocator (glibc), for processes that free and allocate model-sized buffers over and over: keep freed
buffers for reuse (`keep_freed_memory`), give free heap back (`malloc_trim`), and how much is free
(`free_heap_bytes`).

With glibc's defaults every such buffer gets fresh pages: one above the mmap threshold is mapped and unmapped each
time, and one below it sits at the top of the heap, which is trimmed (given back to the kernel) as soon as the free
space there passes twice that threshold. The next use faults every page in again and the kernel zeroes it: about
0.8 ms per 4 MiB here against 0.08 ms to write into memory already held; a third of the CPU of a process of ten
federated clients of a 4 MiB model, and of a relaying switch. The switch (`switch_server.memtrim`) and every
federated actor's process (`nebula.federated.run`, `nebula.federated.actors`) keep freed memory instead.
"""
from __future__ import annotations

__all__ = ["MMAP_THRESHOLD_BYTES", "TRIM_THRESHOLD_BYTES", "free_heap_bytes", "keep_freed_memory", "malloc_trim"]

import ctypes
import ctypes.util
import logging
import os

log = logging.getLogger(__name__)

MMAP_THRESHOLD_BYTES = 32 * 1024**2  # the largest value glibc accepts on 64-bit hosts (half its largest arena heap)
TRIM_THRESHOLD_BYTES = 64 * 1024**2  # free space an arena keeps at its top: the memory keeping costs, per arena
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8  # mallopt's parameters (malloc.h)
_OPERATOR_SET = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_ARENA_MAX")


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


def _libc():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


_LIBC = _libc()
_TRIM = getattr(_LIBC, "malloc_trim", None)  # (None where the C library is not glibc: nothing to do)
_INFO = getattr(_LIBC, "mallinfo2", None)  # (glibc 2.33 and later)
_MALLOPT = getattr(_LIBC, "mallopt", None) if _TRIM is not None else None  # (musl has a mallopt that does nothing)
if _TRIM is not None:
    _TRIM.argtypes, _TRIM.restype = [ctypes.c_size_t], ctypes.c_int
if _INFO is not None:
    _INFO.argtypes, _INFO.restype = [], _MallInfo2


def _operator_set() -> bool:
    """Whether the operator set glibc's malloc variables (MALLOC_*_ or GLIBC_TUNABLES): theirs stand."""
    return any(k in os.environ for k in _OPERATOR_SET) or "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", "")


def keep_freed_memory(trim_bytes: int = TRIM_THRESHOLD_BYTES, *, one_arena: bool = False) -> bool:
    """Keep freed buffers up to MMAP_THRESHOLD_BYTES in the heap, and up to `trim_bytes` of free space at the top
    of each arena, for reuse; with `one_arena`, every thread allocates from the main one (which `malloc_trim` can
    give back). False where nothing changed: not glibc, or the operator's own settings stand. Call it early, before
    the process starts its threads."""
    if _MALLOPT is None or _operator_set():
        return False
    ok = bool(_MALLOPT(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(_MALLOPT(_M_TRIM_THRESHOLD, trim_bytes))
    if ok and one_arena:
        ok = bool(_MALLOPT(_M_ARENA_MAX, 1))
    log.debug("glibc: freed memory %s (trim threshold %d, one arena: %s)", "kept" if ok else "not kept", trim_bytes,
              one_arena)
    return ok


def malloc_trim() -> bool:
    """Return free heap memory to the operating system; False where the C library cannot."""
    if _TRIM is None:
        return False
    _TRIM(0)
    return True


def free_heap_bytes() -> int | None:
    """Bytes the allocator holds free for reuse, in all its arenas (None where it cannot say)."""
    if _INFO is None:
        return None
    info = _INFO()
    return info.fordblks + info.fsmblks
