"""Give freed memory back to the operating system after a flood: glibc keeps freed heap for reuse (the switch
tunes it so, see `switch_server.cli`), which would leave a switch at its peak size long after the peak."""
from __future__ import annotations

__all__ = ["MemoryTrim", "malloc_trim"]

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

TRIM_AFTER_BYTES = 64 * 1024**2  # queued bytes that must have gone since the last trim
TRIM_AFTER_CONNECTIONS = 32  # or unidentified connections that have ended since


def _libc_trim():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc: nothing to do
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


_TRIM = _libc_trim()


def malloc_trim() -> bool:
    """Return free heap memory to the operating system; False where the C library cannot."""
    if _TRIM is None:
        return False
    _TRIM(0)
    return True


class MemoryTrim:
    """Trims once queued bytes have fallen far below their peak and stopped falling (a drain trims once, at its
    end, when its buffers have all been freed), or many unidentified connections have gone."""

    def __init__(self) -> None:
        self.peak_bytes = 0
        self.peak_connections = 0
        self.last_bytes = 0

    def maybe(self, used_bytes: int, connections: int) -> bool:
        """Called periodically with the bytes queued and unidentified connections now; True if it trimmed."""
        falling = used_bytes < self.last_bytes
        self.last_bytes = used_bytes
        self.peak_bytes = max(self.peak_bytes, used_bytes)
        self.peak_connections = max(self.peak_connections, connections)
        if ((falling or self.peak_bytes - used_bytes < TRIM_AFTER_BYTES)
                and self.peak_connections - connections < TRIM_AFTER_CONNECTIONS):
            return False
        self.peak_bytes, self.peak_connections = used_bytes, connections
        trimmed = malloc_trim()
        log.info("returned free memory to the system after a peak" if trimmed else "cannot trim memory here")
        return trimmed
