"""Priority queues per lane: control first, then activation and gradient in turn, then bulk."""
from __future__ import annotations

from collections import deque
from typing import Any

from nebula.wire import Lane


class LaneQueues:
    """Frames waiting for one destination, served strictly by lane level (activation = gradient, round robin)."""

    __slots__ = ("_q", "bytes", "_turn")

    def __init__(self) -> None:
        self._q: tuple[deque, deque, deque, deque] = (deque(), deque(), deque(), deque())
        self.bytes = 0
        self._turn = 0  # alternates activation/gradient so neither starves the other

    def push(self, lane: Lane, item: Any, nbytes: int) -> None:
        """Queue `item` (counted as `nbytes`) on `lane`."""
        self._q[lane].append((item, nbytes))
        self.bytes += nbytes

    def push_front(self, lane: Lane, item: Any, nbytes: int) -> None:
        """Put `item` back at the head of its lane (it could not be sent yet)."""
        self._q[lane].appendleft((item, nbytes))
        self.bytes += nbytes

    def pop(self) -> tuple[Lane, Any, int] | None:
        """Next item by priority, or None when empty."""
        q = self._q
        if q[0]:
            lane = Lane.CONTROL
        elif q[1] or q[2]:
            if q[1] and q[2]:
                lane = Lane.ACTIVATION if self._turn == 0 else Lane.GRADIENT
                self._turn ^= 1
            else:
                lane = Lane.ACTIVATION if q[1] else Lane.GRADIENT
        elif q[3]:
            lane = Lane.BULK
        else:
            return None
        item, nbytes = q[lane].popleft()
        self.bytes -= nbytes
        return lane, item, nbytes

    def only_bulk(self) -> bool:
        """True if the next item would come from the bulk lane."""
        q = self._q
        return bool(q[3]) and not (q[0] or q[1] or q[2])

    def depth(self, lane: Lane) -> int:
        """Number of frames queued on `lane`."""
        return len(self._q[lane])

    def clear(self) -> list[Any]:
        """Remove and return every queued item."""
        items = [it for q in self._q for it, _ in q]
        for q in self._q:
            q.clear()
        self.bytes = 0
        return items

    def __len__(self) -> int:
        return sum(len(q) for q in self._q)

    def __bool__(self) -> bool:
        return any(self._q)
