"""The lane priority rule, once for both sides: control first, then activation and gradient in turn, then bulk."""
from __future__ import annotations

__all__ = ["LaneQueues", "next_lane"]

from collections import deque
from typing import Any, Sequence

from nebula.wire.frame import Lane


def next_lane(queues: Sequence[Any], turn: int) -> tuple[int, int]:
    """(lane to serve next, or -1 when every queue is empty; the next turn) for four queues indexed by lane.

    Activation and gradient share a level and alternate while both wait, so neither starves the other;
    `turn` carries that alternation from one call to the next."""
    if queues[0]:
        return Lane.CONTROL, turn
    if queues[1] or queues[2]:
        if queues[1] and queues[2]:
            return (Lane.ACTIVATION if turn == 0 else Lane.GRADIENT), turn ^ 1
        return (Lane.ACTIVATION if queues[1] else Lane.GRADIENT), turn
    if queues[3]:
        return Lane.BULK, turn
    return -1, turn


class LaneQueues:
    """Frames waiting for one destination, served by `next_lane` and counted in bytes."""

    __slots__ = ("_q", "bytes", "_turn")

    def __init__(self) -> None:
        self._q: tuple[deque, deque, deque, deque] = (deque(), deque(), deque(), deque())
        self.bytes = 0
        self._turn = 0

    def push(self, lane: Lane, item: Any, nbytes: int) -> None:
        """Queue `item` (counted as `nbytes`) on `lane`."""
        self._q[lane].append((item, nbytes))
        self.bytes += nbytes

    def push_front(self, lane: Lane, item: Any, nbytes: int) -> None:
        """Put `item` back at the head of its lane (it could not be sent yet)."""
        self._q[lane].appendleft((item, nbytes))
        self.bytes += nbytes

    def pop(self) -> tuple[Lane, Any, int] | None:
        """(lane, item, nbytes) of the next item by priority, or None when empty."""
        lane, self._turn = next_lane(self._q, self._turn)
        if lane < 0:
            return None
        item, nbytes = self._q[lane].popleft()
        self.bytes -= nbytes
        return Lane(lane), item, nbytes

    def only_bulk(self) -> bool:
        """True if the next item would come from the bulk lane."""
        q = self._q
        return bool(q[3]) and not (q[0] or q[1] or q[2])

    def depth(self, lane: Lane) -> int:
        """Number of frames queued on `lane`."""
        return len(self._q[lane])

    def remove_if(self, pred: Any) -> list[Any]:
        """Remove and return the queued items for which `pred(item)` is true (order kept for the rest)."""
        out = []
        for q in self._q:
            if not q:
                continue
            keep = deque()
            for item, nbytes in q:
                if pred(item):
                    out.append(item)
                    self.bytes -= nbytes
                else:
                    keep.append((item, nbytes))
            q.clear()
            q.extend(keep)
        return out

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
