"""Worker side of the shared-memory arena its switch offers over IPC (`nebula.wire.shm`).

Upward payloads are written into the arena's first half (we allocate, the switch releases); downward payloads
are read from its second half (the switch allocates, we hand regions back in batches). Every step may fall back
to an inline payload, so this object changes only where bytes lie, never what arrives.
"""
from __future__ import annotations

import logging
from typing import Any, NamedTuple

from nebula.wire import FrameType, WireError, encode_frame
from nebula.wire.shm import RELEASE_DELAY_S, SHM_MIN_BYTES, Arena, ReleaseBatch, Ring, pack_desc, read_desc

__all__ = ["SHM_WAIT_S", "Pieces", "Region", "ArenaClient"]

log = logging.getLogger(__name__)

# a full arena is waited on this long (the switch hands regions back as its link sends them); then payloads go
# through the socket until it does
SHM_WAIT_S = 0.05


class Pieces:
    """A payload in pieces (a batch frame's length table and messages): the arena takes the pieces one after
    another, and only a payload that goes through the socket is joined, so a batch costs one copy, not two."""

    __slots__ = ("parts", "nbytes")

    def __init__(self, parts: list[Any]) -> None:
        self.parts = parts
        self.nbytes = sum(len(p) for p in parts)

    def __len__(self) -> int:
        return self.nbytes

    def join(self) -> bytes:
        """The payload in one piece."""
        return b"".join(self.parts)

    def write_to(self, dest: memoryview) -> None:
        """Copy the pieces, in order, to the start of `dest`."""
        off = 0
        for p in self.parts:
            n = len(p)
            dest[off : off + n] = p
            off += n


class Region(NamedTuple):
    """A downward payload's place in an arena, handed back once it is read."""

    token: int
    offset: int
    nbytes: int


class ArenaClient:
    """The arena this worker mapped (if any), its upward allocator, and the downward regions to hand back."""

    def __init__(self, wanted: bool) -> None:
        self.wanted = wanted  # IPC transport and shared_memory enabled in worker.yaml
        self.arena: Arena | None = None
        self.up_ring: Ring | None = None
        self.refused = 0  # token of an offered arena we could not map (not tried again)
        self.full_since: float | None = None  # the upward half has had no room since then
        self.waiting = False  # the next frame waits for room in it (so: no POLLOUT wake-ups meanwhile)
        self.releases: ReleaseBatch | None = None  # downward regions read and not yet handed back

    @property
    def token(self) -> int:
        """Token of the mapped arena, 0 when none is."""
        return self.arena.token if self.arena is not None else 0

    def take(self, offer: Any) -> bool:
        """Map the arena a WELCOME offers unless it is the one we have (or could not map); True if newly mapped."""
        try:
            pid, fd, token, half = (int(offer[k]) for k in ("pid", "fd", "token", "bytes"))
        except (TypeError, KeyError, ValueError):
            log.warning("switch offered shared memory in a form this worker does not understand: %r", offer)
            return False
        if token in (self.refused, self.token):
            return False
        try:
            arena = Arena.open(pid, fd, token, half)
        except OSError as exc:
            log.warning("cannot map the switch's shared memory (%s); payloads go through the socket", exc)
            self.refused = token
            return False
        # regions of the old arena are forgotten with it: frames still naming it are dropped by the switch and
        # sent again, like everything else after a switch restart
        self.arena, self.up_ring, self.releases, self.full_since = arena, Ring(half), ReleaseBatch(half), None
        return True

    def fits(self, n: int) -> bool:
        """Whether a payload of `n` bytes should go through the arena (else inline)."""
        return SHM_MIN_BYTES <= n and self.up_ring is not None and n <= self.up_ring.size

    def put(self, payload: Any, now: float) -> tuple[bytes, int] | bool:
        """Copy an upward payload into the arena: (descriptor, offset); False: wait for room; True: go inline."""
        n = len(payload)
        off = self.up_ring.alloc(n)
        if off is None:  # the switch still holds the arena: wait for a release a while, then go inline
            if self.full_since is None:
                self.full_since = now
            if now - self.full_since < SHM_WAIT_S:
                self.waiting = True
                return False
            return True
        if isinstance(payload, Pieces):
            payload.write_to(self.arena.up[off : off + n])
        else:
            self.arena.up[off : off + n] = payload
        return pack_desc(self.arena.token, off, n), off

    def unput(self, off: int) -> None:
        """The descriptor at `off` could not be sent: free its region."""
        self.up_ring.free(off)

    def on_release(self, meta: dict) -> None:
        """The switch is done with upward regions (an SHM_RELEASE frame)."""
        if self.arena is not None and meta["token"] == self.arena.token:
            for off in meta["offsets"]:
                self.up_ring.free(off)
            self.full_since = None

    def payload(self, desc: memoryview) -> tuple[memoryview, Region]:
        """A downward payload in the arena and its region; WireError if the descriptor is unsound or not ours."""
        found = read_desc(desc, self.arena, self.arena.down if self.arena is not None else memoryview(b""))
        if found is None:
            raise WireError("bad_shm", "descriptor names an arena which this worker has not mapped")
        off, view = found
        return view, Region(self.arena.token, off, len(view))

    @property
    def release_due(self) -> float | None:
        """When the regions waiting to go back are due at the latest (None: none wait)."""
        if self.releases is None or not self.releases.offsets:
            return None
        return self.releases.since + RELEASE_DELAY_S

    def release(self, region: Region | None) -> None:
        """We no longer need a downward region: the switch may reuse it (told in the next release frame)."""
        # a replaced arena's regions went with it: an offset of it must not free a live region of the new one
        if region is not None and region.token == self.token:
            self.releases.add(region.offset, region.nbytes)

    def release_frames(self) -> list[bytes]:
        """SHM_RELEASE frame heads for the regions waiting to go back, once a batch is due (else none)."""
        if self.releases is None or not self.releases.due():
            return []
        return [encode_frame(FrameType.SHM_RELEASE, meta) for meta in self.releases.take(self.token)]
