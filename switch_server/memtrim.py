"""The switch's use of the C allocator: freed buffers are kept for reuse while it relays (`keep_freed_memory`), and
given back to the operating system after a flood (`MemoryTrim`), which would otherwise leave it at its peak size.

The trigger is the allocator's own count of free heap bytes (`mallinfo2`), not the switch's queue counters:
a queued message is counted off when it is handed on, but its buffer is freed only once the socket has taken it,
and buffers of connections that never identified themselves are in no queue at all."""
from __future__ import annotations

__all__ = ["MemoryTrim", "free_heap_bytes", "keep_freed_memory", "malloc_trim"]

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

TRIM_FREED_BYTES = 16 * 1024**2  # heap freed since the last trim (or its low mark since) that triggers a trim
TRIM_EVERY_S = 5.0  # at most this often: under heavy relaying the heap breathes, and trimmed pages fault back in

# glibc gives each freed multi-megabyte buffer straight back to the kernel, so every chunk the switch relays
# would cost fresh page faults (measured: about a third of a relaying switch's CPU); keep such memory for reuse
KEEP_MMAP_THRESHOLD_BYTES = 32 * 1024**2  # the largest value glibc accepts
KEEP_TRIM_THRESHOLD_BYTES = 128 * 1024**2
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8


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
_MALLOPT = getattr(_LIBC, "mallopt", None)
if _TRIM is not None:
    _TRIM.argtypes, _TRIM.restype = [ctypes.c_size_t], ctypes.c_int
if _INFO is not None:
    _INFO.argtypes, _INFO.restype = [], _MallInfo2


def keep_freed_memory() -> bool:
    """Tune the allocator (glibc) to keep large freed buffers for reuse instead of unmapping them, in one arena;
    False where the C library cannot be tuned so. Call before any thread starts."""
    if _MALLOPT is None:
        return False
    _MALLOPT(_M_MMAP_THRESHOLD, KEEP_MMAP_THRESHOLD_BYTES)
    _MALLOPT(_M_TRIM_THRESHOLD, KEEP_TRIM_THRESHOLD_BYTES)
    # One arena for all threads: memory freed at the top of a thread's own arena (where ZeroMQ's I/O thread
    # allocates every received message) goes back only when that top passes the trim threshold, which is above
    # an arena's largest size, and malloc_trim cannot return it; in the main arena it can.
    _MALLOPT(_M_ARENA_MAX, 1)
    return True


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


class MemoryTrim:
    """Trims when at least TRIM_FREED_BYTES of heap have been freed since the last trim (counted from the lowest
    free count seen since, so memory reused and freed again counts), at most every TRIM_EVERY_S."""

    def __init__(self) -> None:
        self.low: int | None = None  # lowest free count since the last trim
        self.last_s = float("-inf")

    def maybe(self, free_bytes: int | None, now_s: float) -> bool:
        """Called periodically with `free_heap_bytes()` and a monotonic time; True if it trimmed."""
        if free_bytes is None:
            return False
        self.low = free_bytes if self.low is None else min(self.low, free_bytes)
        if free_bytes - self.low < TRIM_FREED_BYTES or now_s - self.last_s < TRIM_EVERY_S:
            return False
        trimmed = malloc_trim()
        self.low, self.last_s = free_heap_bytes() if trimmed else free_bytes, now_s
        log.debug("returned free heap to the system" if trimmed else "cannot trim memory here")
        return trimmed
