"""The switch's side of its workers' shared-memory arenas (`nebula.wire.shm`): upward payloads handed back once
nothing here refers to them, in batches; downward regions allocated for the worker."""
from __future__ import annotations

__all__ = ["ArenaLedger", "ShmReleases", "WorkerShm"]

import asyncio
import mmap
import os
import weakref
from typing import Callable

import numpy as np

from nebula.wire.shm import RELEASE_DELAY_S, Arena, ReleaseBatch, Ring, read_desc


class ArenaLedger:
    """Bytes of all live arenas (both halves, `used`) and of their pages in memory (`resident`), against the
    switch's budget for them (`Budgets.arenas`). A page is in memory once a payload touched it, and stays so; while
    the arenas' pages in memory pass the budget (`lean`), the pages of every region handed back go back to the
    kernel at once, so what arenas hold follows the bytes in flight, not the number of workers (below the budget,
    pages are kept: touching them again costs a page fault and a zeroed page each)."""

    __slots__ = ("used", "resident", "budget")

    def __init__(self, budget: int) -> None:
        self.used = 0
        self.resident = 0
        self.budget = budget

    @property
    def lean(self) -> bool:
        """Whether freed regions give their pages back now."""
        return self.resident > self.budget

    def take(self, nbytes: int) -> None:
        """Count a new arena of `nbytes`."""
        self.used += nbytes

    def give(self, nbytes: int) -> None:
        """An arena of `nbytes` is gone."""
        self.used -= nbytes


class _Placed(np.ndarray):
    """A downward region a peer's frame is decrypted into (`WorkerShm.place`); `owner`, `off` and `handed` ([bool]:
    the worker was given it, and hands it back itself) ride on the array that backs the payload's view."""


class WorkerShm:
    """One worker connection's arena: releases its upward regions, allocates downward regions for it."""

    def __init__(self, ident: bytes, half: int, on_release: Callable[[WorkerShm, bool], None],
                 ledger: ArenaLedger | None = None) -> None:
        self.ident = ident  # the connection it belongs to
        self.ledger = ledger or ArenaLedger(1 << 62)  # counts this arena until `close`
        self.arena = Arena.create(half)
        self.ledger.take(2 * half)
        self.pages = bytearray(-(-2 * half // mmap.PAGESIZE))  # 1: the page is in memory (as far as we know)
        self.down = Ring(half)
        self.ready = False  # the worker has mapped it: downward payloads may use it
        self.closed = False
        self.releases = ReleaseBatch(half)
        self._on_release = on_release

    def offer(self) -> dict[str, int]:
        """WELCOME's description of the arena, for the worker to map it."""
        return {"pid": os.getpid(), "fd": self.arena.fd, "token": self.arena.token, "bytes": self.arena.half}

    def up_payload(self, desc: memoryview) -> memoryview | None:
        """The worker's payload a descriptor names (None if it names an arena this connection no longer has;
        WireError if unsound). The region goes back to the worker when the last view of it is gone (the link's
        retransmit buffer, a queue, a failed route: wherever it was last held)."""
        found = read_desc(desc, self.arena, self.arena.up)
        if found is None:
            return None
        off, region = found
        self._touch(off, len(region))
        arr = np.frombuffer(region, dtype=np.uint8)
        weakref.finalize(arr, self._released, off, len(region)).atexit = False
        return memoryview(arr)

    def down_alloc(self, n: int) -> int | None:
        """Offset of `n` bytes of the downward half for a payload to the worker (None: no room now)."""
        off = self.down.alloc(n)
        if off is not None:
            self._touch(self.arena.half + off, n)
        return off

    def place(self, n: int) -> memoryview | None:
        """A downward region of `n` bytes for a payload still to be read from a peer link, so that TLS decrypts it
        where the worker reads it, and it is never copied here (None: no room, or the worker has not mapped the
        arena). The region is handed back when the last view of it goes, unless `placed_at` gave it to the worker."""
        if not self.ready or self.closed:
            return None
        off = self.down_alloc(n)
        if off is None:
            return None
        arr = np.frombuffer(self.arena.down[off : off + n], dtype=np.uint8).view(_Placed)
        arr.owner, arr.off, arr.handed = self, off, [False]
        weakref.finalize(arr, self._unplace, off, arr.handed).atexit = False
        return memoryview(arr)

    def placed_at(self, payload: object) -> int | None:
        """The offset of `payload` if `place` put it in this arena and it is not the worker's yet; from now on it
        is (the worker hands it back): `unhand` if it could not be told."""
        arr = payload.obj if isinstance(payload, memoryview) else None
        if type(arr) is not _Placed or arr.owner is not self or arr.handed[0] or self.closed:
            return None
        arr.handed[0] = True
        return arr.off

    @staticmethod
    def unhand(payload: object) -> None:
        """The worker was not told of a placed payload after all: it is ours to hand back again."""
        arr = payload.obj if isinstance(payload, memoryview) else None
        if type(arr) is _Placed:
            arr.handed[0] = False

    def _unplace(self, off: int, handed: list[bool]) -> None:
        if not handed[0] and not self.closed:
            self.down_free(off)

    def _touch(self, start: int, n: int) -> None:
        first, last = start // mmap.PAGESIZE, (start + n - 1) // mmap.PAGESIZE + 1
        new = self.pages.count(0, first, last)
        if new:
            self.pages[first:last] = b"\x01" * (last - first)
            self.ledger.resident += new * mmap.PAGESIZE

    def _discard(self, half: memoryview, off: int, n: int) -> None:
        start, end = self.arena.discard(half, off, n)
        first, last = start // mmap.PAGESIZE, end // mmap.PAGESIZE
        if last > first:
            self.ledger.resident -= self.pages.count(1, first, last) * mmap.PAGESIZE
            self.pages[first:last] = bytes(last - first)

    def _released(self, off: int, n: int) -> None:
        if self.ledger.lean and not self.closed:
            self._discard(self.arena.up, off, n)  # (before the worker learns the region is free)
        self._on_release(self, self.releases.add(off, n))

    def down_free(self, off: int) -> None:
        """The worker is done with a downward region (SHM_RELEASE); an unknown offset is a stale release."""
        n = self.down.free(off)
        if n and self.ledger.lean and not self.closed:
            self._discard(self.arena.down, off, n)

    def close(self) -> None:
        """The connection is gone: its arena goes with the last view of it."""
        if not self.closed:
            self.ledger.give(2 * self.arena.half)
            self.ledger.resident -= self.pages.count(1) * mmap.PAGESIZE
        self.closed = True
        self.arena.close_fd()


class ShmReleases:
    """Sends the regions that arenas released back to their workers: at once when `release_now` says so, else
    RELEASE_DELAY_S after the first one."""

    def __init__(self, send: Callable[[bytes, dict], None]) -> None:
        self._send = send  # (connection identity, SHM_RELEASE meta)
        self._waiting: set[WorkerShm] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._soon = False

    def released(self, shm: WorkerShm, now: bool) -> None:
        """An upward region of `shm` is free (called as its last view goes)."""
        self._waiting.add(shm)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # shutting down: the arena goes with the process
            return
        if now:
            if not self._soon:
                self._soon = True
                loop.call_soon(self.flush)
        elif self._timer is None:
            self._timer = loop.call_later(RELEASE_DELAY_S, self.flush)

    def flush(self) -> None:
        """Send every waiting release."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._soon = False
        for shm in self._waiting:
            metas = shm.releases.take(shm.arena.token)
            if shm.closed:  # the connection is gone, and its arena with it
                continue
            for meta in metas:
                self._send(shm.ident, meta)
        self._waiting.clear()
