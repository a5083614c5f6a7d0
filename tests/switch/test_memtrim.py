"""Memory goes back to the operating system once the allocator holds much freed heap, and not too often."""
from __future__ import annotations

import subprocess
import sys

import pytest

from switch_server.memtrim import TRIM_EVERY_S, TRIM_FREED_BYTES, MemoryTrim

MIB = 1024**2


def test_trims_once_enough_heap_is_free_and_not_more_often_than_its_interval():
    t = MemoryTrim()
    assert not t.maybe(10 * MIB, 0.0)  # (the first count is the low mark)
    assert not t.maybe(10 * MIB + TRIM_FREED_BYTES - 1, 1.0)
    assert t.maybe(10 * MIB + TRIM_FREED_BYTES, 2.0)
    low = t.low
    assert not t.maybe(low + TRIM_FREED_BYTES, 2.0 + TRIM_EVERY_S / 2)  # too soon after the last
    assert t.maybe(low + TRIM_FREED_BYTES, 2.0 + TRIM_EVERY_S)


def test_memory_reused_and_freed_again_counts_from_the_low_mark():
    t = MemoryTrim()
    t.maybe(40 * MIB, 0.0)
    assert not t.maybe(40 * MIB - TRIM_FREED_BYTES, 1.0)  # the free heap was taken again...
    assert t.maybe(40 * MIB, 2.0)  # ...and given back: resident again, so trimmed


def test_no_count_no_trim():
    assert not MemoryTrim().maybe(None, 100.0)


ALLOCATOR_PROBE = """
import ctypes, sys, threading
from switch_server.memtrim import free_heap_bytes, keep_freed_memory, malloc_trim
assert keep_freed_memory()  # as the switch tunes glibc: freed buffers stay in the heap
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
rss = lambda: int(open("/proc/self/statm").read().split()[1]) * 4096
blocks = []
def allocate():
    blocks.extend(libc.malloc(1 << 20) for _ in range(48))
    for b in blocks:
        ctypes.memset(b, 1, 1 << 20)
if sys.argv[1] == "thread":  # in a thread's own arena, as ZeroMQ's I/O thread allocates received messages
    t = threading.Thread(target=allocate)
    t.start()
    t.join()
else:
    allocate()
free0, rss0 = free_heap_bytes(), rss()
for b in blocks:
    libc.free(b)
free1, rss1 = free_heap_bytes(), rss()
assert malloc_trim()
print(free1 - free0, rss1 - rss0, rss() - rss1)
"""


@pytest.mark.parametrize("where", ["main", "thread"])
def test_the_allocator_counts_freed_heap_and_a_trim_gives_it_back(where):
    """In a process tuned as the switch is, 48 MiB freed stay resident and show in the free count; a trim returns
    them, also from a thread's arena."""
    out = subprocess.run([sys.executable, "-c", ALLOCATOR_PROBE, where], capture_output=True, text=True, check=True)
    freed, rss_after_free, rss_after_trim = map(int, out.stdout.split())
    assert freed >= 47 * MIB
    assert rss_after_free > -8 * MIB  # (kept for reuse)
    assert rss_after_trim < -40 * MIB
