"""The switch's use of the C allocator: freed buffers are kept for reuse while it relays (`keep_freed_memory`), and
given back to the operating system after a flood (`MemoryTrim`), which would otherwise leave it at its peak size.

The trigger is the allocator's own count of free heap bytes (`mallinfo2`), not the switch's queue counters:
a queued message is counted off when it is handed on, but its buffer is freed only once the socket has taken it,
and buffers of connections that never identified themselves are in no queue at all."""
from __future__ import annotations

__all__ = ["MemoryTrim", "free_heap_bytes", "keep_freed_memory", "malloc_trim"]

import logging

from nebula import heap
from nebula.heap import free_heap_bytes, malloc_trim

log = logging.getLogger(__name__)

TRIM_FREED_BYTES = 16 * 1024**2  # heap freed since the last trim (or its low mark since) that triggers a trim
TRIM_EVERY_S = 5.0  # at most this often: under heavy relaying the heap breathes, and trimmed pages fault back in
KEEP_TRIM_THRESHOLD_BYTES = 128 * 1024**2


def keep_freed_memory() -> bool:
    """Keep large freed buffers for reuse (`nebula.heap`: every relayed chunk would otherwise cost fresh page
    faults), in one arena; False where the C library cannot be tuned so, or the operator tuned it. Call before any
    thread starts."""
    # One arena for all threads: memory freed at the top of a thread's own arena (where ZeroMQ's I/O thread
    # allocates every received message) goes back only when that top passes the trim threshold, which is above
    # an arena's largest size, and malloc_trim cannot return it; in the main arena it can.
    return heap.keep_freed_memory(KEEP_TRIM_THRESHOLD_BYTES, one_arena=True)


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
