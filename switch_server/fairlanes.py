"""The queues of one peer link: lanes by priority (`nebula.wire.next_lane`), and inside each lane the parties (local
accounts) served in turn by deficit round robin over bytes, so that one account's flood leaves every other its
share of the link. A party the peer asked to hold back (`hold`) is skipped until its hold ends."""
from __future__ import annotations

__all__ = ["FairLanes", "QUANTUM_BYTES"]

import time
from collections import deque
from typing import Any, Hashable

from nebula.wire import Lane, next_lane

QUANTUM_BYTES = 64 * 1024  # bytes a party may send per turn before the next party's turn


class _Lane:
    """One lane: a FIFO per party, parties with frames served in turn (deficit round robin)."""

    __slots__ = ("queues", "turns", "deficit", "frames")

    def __init__(self) -> None:
        self.queues: dict[Hashable, deque] = {}
        self.turns: deque[Hashable] = deque()  # parties with frames, in serving order
        self.deficit: dict[Hashable, int] = {}
        self.frames = 0

    def push(self, party: Hashable, item: Any, nbytes: int, front: bool = False) -> None:
        q = self.queues.get(party)
        if q is None:
            q = self.queues[party] = deque()
            self.turns.append(party)
            self.deficit[party] = 0
        if front:
            q.appendleft((item, nbytes))
        else:
            q.append((item, nbytes))
        self.frames += 1

    def servable(self, held: dict[Hashable, float], now: float) -> bool:
        return any(p not in held or held[p] <= now for p in self.turns)

    def pop(self, held: dict[Hashable, float], now: float) -> tuple[Any, int] | None:
        if not self.servable(held, now):
            return None
        while True:  # (every turn adds a quantum to a party not held: some head fits after finitely many)
            party = self.turns[0]
            if party in held and held[party] > now:
                self.turns.rotate(-1)
                continue
            q = self.queues[party]
            item, nbytes = q[0]
            if self.deficit[party] < nbytes:
                self.deficit[party] += QUANTUM_BYTES
                if self.deficit[party] < nbytes and len(self.turns) > 1:
                    self.turns.rotate(-1)
                    continue
            q.popleft()
            self.frames -= 1
            self.deficit[party] = max(0, self.deficit[party] - nbytes)
            if not q:
                del self.queues[party], self.deficit[party]
                self.turns.popleft()
            return item, nbytes

    def clear(self) -> list[Any]:
        items = [it for q in self.queues.values() for it, _ in q]
        self.queues.clear()
        self.turns.clear()
        self.deficit.clear()
        self.frames = 0
        return items


class _Ready:
    """A lane seen through `next_lane`: true while it has a frame of a party not held back."""

    __slots__ = ("lane", "lanes")

    def __init__(self, lane: _Lane, lanes: FairLanes) -> None:
        self.lane, self.lanes = lane, lanes

    def __bool__(self) -> bool:
        return self.lane.servable(self.lanes.held, self.lanes.now)


class FairLanes:
    """Frames waiting for one peer link: items are (head, payload, party); parties share each lane fairly."""

    def __init__(self) -> None:
        self._lanes = tuple(_Lane() for _ in Lane)
        self._ready = tuple(_Ready(q, self) for q in self._lanes)
        self.bytes = 0
        self.held: dict[Hashable, float] = {}  # party -> until when it is held back (time.monotonic)
        self.now = 0.0
        self._turn = 0

    def push(self, lane: Lane, item: tuple[Any, Any, Any], nbytes: int) -> None:
        """Queue `item` = (head, payload, party), counted as `nbytes`, on `lane`."""
        self._lanes[lane].push(item[2], item, nbytes)
        self.bytes += nbytes

    def hold(self, party: Hashable, seconds: float) -> None:
        """Serve none of `party`'s frames for `seconds` (the peer cannot take them now)."""
        self.held[party] = time.monotonic() + seconds

    def next_release(self) -> float | None:
        """When the earliest hold of a party with frames ends (None: no such hold)."""
        now = time.monotonic()
        waiting = [until for p, until in self.held.items() if until > now
                   and any(p in q.queues for q in self._lanes)]
        return min(waiting) if waiting else None

    def pop(self) -> tuple[Lane, Any, int] | None:
        """(lane, item, nbytes) of the next frame by lane priority and party turn; None if none may go now."""
        self.now = time.monotonic()
        if self.held:
            for p in [p for p, until in self.held.items() if until <= self.now]:
                del self.held[p]
        lane, self._turn = next_lane(self._ready, self._turn)
        if lane < 0:
            return None
        got = self._lanes[lane].pop(self.held, self.now)
        if got is None:
            return None
        item, nbytes = got
        self.bytes -= nbytes
        return Lane(lane), item, nbytes

    def only_bulk(self) -> bool:
        """True if the next frame would come from the bulk lane."""
        self.now = time.monotonic()
        r = self._ready
        return bool(r[3]) and not (r[0] or r[1] or r[2])

    def by_party(self) -> dict[Hashable, int]:
        """Bytes queued per party (all lanes)."""
        out: dict[Hashable, int] = {}
        for q in self._lanes:
            for party, frames in q.queues.items():
                out[party] = out.get(party, 0) + sum(n for _, n in frames)
        return out

    def holding(self) -> list[Hashable]:
        """Parties held back now."""
        now = time.monotonic()
        return [p for p, until in self.held.items() if until > now]

    def depth(self, lane: Lane) -> int:
        """Number of frames queued on `lane`."""
        return self._lanes[lane].frames

    def clear(self) -> list[Any]:
        """Remove and return every queued item."""
        self.bytes = 0
        return [it for q in self._lanes for it in q.clear()]

    def __len__(self) -> int:
        return sum(q.frames for q in self._lanes)

    def __bool__(self) -> bool:
        """True when some frame may go now (held parties' frames wait)."""
        self.now = time.monotonic()
        return any(self._ready)
