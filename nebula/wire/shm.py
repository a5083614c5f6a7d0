"""Shared-memory payloads between a switch server and the workers on its own host.

Over the IPC endpoint every payload byte would cross the kernel twice per hop (into the socket, out of it), and
the ZeroMQ I/O threads would move it. Instead, each worker connection that asks for it gets an *arena*: one
sealed memfd that the switch creates and the worker maps through `/proc/<switch pid>/fd/<fd>`. Its first half
carries payloads upwards (the worker allocates, the switch releases once the peer link no longer needs them);
its second half carries them downwards (the switch allocates, the worker releases once it has read them).
A ZeroMQ message then holds the frame head and a 24-byte descriptor instead of the payload.

Every step falls back to an inline payload (arena full, not mapped, too small a payload), so shared memory
changes only where the bytes live, never what arrives. The switch seals the memfd against shrinking, so a
worker cannot make the switch's mapping fault; the memfd's name carries a random token that the worker checks
after opening, so it never maps some other file that happens to have that descriptor number. Only processes
that may already read the switch's memory (its user, or root) can open the arena at all.
"""
from __future__ import annotations

__all__ = ["RELEASE_BATCH", "RELEASE_DELAY_S", "SHM_MIN_BYTES", "SHM_TAG", "Arena", "ReleaseBatch", "Ring",
           "pack_desc", "read_desc", "release_metas", "release_now", "unpack_desc"]

import fcntl
import time
import mmap
import os
import secrets
import struct
from collections import deque

from nebula.wire.frame import WireError

SHM_TAG = b"NEBULA-SHM"  # the middle ZeroMQ part of a DATA message whose payload lies in the arena
SHM_MIN_BYTES = 8192  # smaller payloads travel inline: the descriptor and release cost more than the copy
RELEASE_BATCH = 500  # offsets per SHM_RELEASE frame (keeps its meta well inside the wire's limit)
# both sides hand regions back in batches: when a quarter of the arena waits, or this long after the first one
# (a release per frame would cost every message another wake-up on the other side)
RELEASE_DELAY_S = 0.02


def release_now(pending_bytes: int, half: int) -> bool:
    """Whether released regions of `pending_bytes` in an arena half of `half` bytes should go back at once."""
    return pending_bytes >= half // 4


def release_metas(token: int, offsets: list[int]) -> list[dict]:
    """SHM_RELEASE metas handing `offsets` of arena `token` back, at most RELEASE_BATCH offsets each."""
    return [{"token": token, "offsets": offsets[i : i + RELEASE_BATCH]} for i in range(0, len(offsets), RELEASE_BATCH)]


class ReleaseBatch:
    """Regions this side is done with, gathered until they go back to the other side in SHM_RELEASE frames:
    at once when a quarter of the arena half waits (`release_now`), else RELEASE_DELAY_S after the first one."""

    __slots__ = ("half", "offsets", "nbytes", "since")

    def __init__(self, half: int) -> None:
        self.half = half
        self.offsets: list[int] = []
        self.nbytes = 0
        self.since = 0.0  # when the first waiting region was added

    def add(self, off: int, n: int) -> bool:
        """Add the region of `n` bytes at `off`; True if the batch should go back now."""
        if not self.offsets:
            self.since = time.monotonic()
        self.offsets.append(off)
        self.nbytes += n
        return release_now(self.nbytes, self.half)

    def due(self) -> bool:
        """Whether waiting regions should go back now (enough bytes, or waited RELEASE_DELAY_S)."""
        return bool(self.offsets) and (release_now(self.nbytes, self.half)
                                       or time.monotonic() - self.since >= RELEASE_DELAY_S)

    def take(self, token: int) -> list[dict]:
        """SHM_RELEASE metas for every waiting region of arena `token`; the batch is empty afterwards."""
        offsets, self.offsets, self.nbytes = self.offsets, [], 0
        return release_metas(token, offsets)


_DESC = struct.Struct("!QQQ")  # token, offset within the direction's half, length
_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
_NAME = "nebula-shm-"


def pack_desc(token: int, offset: int, length: int) -> bytes:
    """The descriptor part naming `length` bytes at `offset` of an arena."""
    return _DESC.pack(token, offset, length)


def unpack_desc(buf: bytes | memoryview) -> tuple[int, int, int]:
    """(token, offset, length) of a descriptor part; WireError if it is not one."""
    if len(buf) != _DESC.size:
        raise WireError("bad_shm", f"shared-memory descriptor has {len(buf)} bytes, expected {_DESC.size}")
    return _DESC.unpack(buf)


def read_desc(buf: bytes | memoryview, arena: Arena | None, half: memoryview) -> tuple[int, memoryview] | None:
    """(offset, region) a descriptor names in `half` of `arena`; None if it names another arena (one this side
    no longer has: stale, not hostile); WireError if it is malformed or lies outside the half."""
    token, off, n = unpack_desc(buf)
    if arena is None or token != arena.token:
        return None
    return off, arena.region(half, off, n)


class Ring:
    """First-in-first-out allocator over [0, size) that accepts frees in any order.

    Space is reused once every older allocation is free as well, which suits payloads that are released
    roughly in the order they were sent; a long-held region only makes later allocations fail (the caller
    then sends inline), it never corrupts anything.
    """

    def __init__(self, size: int) -> None:
        if size <= 0:
            raise ValueError(f"ring size {size} must be positive")
        self.size = size
        self._live: deque[list] = deque()  # [offset, length, freed] in allocation order
        self._at: dict[int, list] = {}
        self._head = 0
        self.used = 0  # bytes allocated and not yet freed

    def alloc(self, n: int) -> int | None:
        """Offset of `n` fresh bytes, or None when they do not fit now."""
        if n <= 0 or n > self.size:
            return None
        if not self._live:
            off = 0
        else:
            tail = self._live[0][0]
            if self._head > tail:  # [tail, head) in use: free space at the end, then before tail
                if self.size - self._head >= n:
                    off = self._head
                elif tail >= n:
                    off = 0
                else:
                    return None
            elif tail - self._head >= n:  # wrapped: free space is [head, tail)
                off = self._head
            else:
                return None
        entry = [off, n, False]
        self._live.append(entry)
        self._at[off] = entry
        self._head = off + n
        self.used += n
        return off

    def free(self, off: int) -> int:
        """Release the allocation at `off`; its length, or 0 if there is none (a stale or forged release)."""
        entry = self._at.pop(off, None)
        if entry is None:
            return 0
        entry[2] = True
        self.used -= entry[1]
        live = self._live
        while live and live[0][2]:
            live.popleft()
        if not live:
            self._head = 0
        return entry[1]


class Arena:
    """One worker connection's shared memory: `half` bytes upwards, then `half` bytes downwards."""

    def __init__(self, fd: int, token: int, half: int, owner: bool) -> None:
        self.fd = fd
        self.token = token
        self.half = half
        self._map = mmap.mmap(fd, 2 * half)
        self.view = memoryview(self._map)
        self.up = self.view[:half]
        self.down = self.view[half:]
        self.owner = owner
        if not owner:  # the worker keeps only the mapping
            os.close(fd)
            self.fd = -1

    @classmethod
    def create(cls, half: int) -> Arena:
        """A new sealed arena (switch side); its fd stays open until `close_fd`, so the worker can open it."""
        token = secrets.randbits(63) | 1
        fd = os.memfd_create(f"{_NAME}{token:016x}", os.MFD_ALLOW_SEALING | os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, 2 * half)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
            return cls(fd, token, half, owner=True)
        except BaseException:
            os.close(fd)
            raise

    @classmethod
    def open(cls, pid: int, fd: int, token: int, half: int) -> Arena:
        """Map the switch's arena (worker side); OSError naming the problem if it is not the expected one."""
        path = f"/proc/{pid}/fd/{fd}"
        mine = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            name = os.readlink(f"/proc/self/fd/{mine}")
            if f"{_NAME}{token:016x}" not in name:
                raise OSError(f"{path} is {name!r}, not the arena {token:016x} the switch announced")
            size = os.fstat(mine).st_size
            if size != 2 * half:
                raise OSError(f"arena {path} has {size} bytes, the switch announced {2 * half}")
            if fcntl.fcntl(mine, fcntl.F_GET_SEALS) & _SEALS != _SEALS:
                raise OSError(f"arena {path} is not sealed against resizing")
            return cls(mine, token, half, owner=False)
        except BaseException:
            os.close(mine)
            raise

    def region(self, half: memoryview, off: int, n: int) -> memoryview:
        """`n` bytes at `off` of one half; WireError if they do not lie inside it."""
        if off < 0 or n <= 0 or off + n > self.half:
            raise WireError("bad_shm", f"shared-memory region [{off}, {off + n}) is outside the arena's {self.half} bytes")
        return half[off : off + n]

    def discard(self, half: memoryview, off: int, n: int) -> tuple[int, int]:
        """Give the whole pages of a free region of `half` (`up` or `down`) back to the kernel: they read as zeros
        until written again. Only for a region no one uses: the other side must not have it (for a region the
        other side allocates, call this before telling it the region is free). Returns the byte range of the arena
        given back."""
        base = (0 if half is self.up else self.half) + off
        start = -(-base // mmap.PAGESIZE) * mmap.PAGESIZE
        end = (base + n) // mmap.PAGESIZE * mmap.PAGESIZE
        if end > start:
            self._map.madvise(mmap.MADV_REMOVE, start, end - start)
        return start, max(start, end)

    def close_fd(self) -> None:
        """Close the switch's descriptor (the mapping stays until nothing refers to it)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
