"""How often the switch answers one worker connection's refused or closing frames (ERROR, BYE): a connection that
floods them gets a few answers a second, not one per frame, so a flood costs the switch parsing only."""
from __future__ import annotations

__all__ = ["ANSWERS_PER_S", "ANSWER_BURST", "AnswerLimiter"]

ANSWERS_PER_S = 200.0
ANSWER_BURST = 1000.0
MAX_TRACKED = 10_000  # connections tracked (the oldest is forgotten first: it starts again with a full bucket)


class AnswerLimiter:
    """A token bucket of answers per connection identity."""

    def __init__(self, rate: float = ANSWERS_PER_S, burst: float = ANSWER_BURST) -> None:
        self.rate, self.burst = rate, burst
        self._buckets: dict[bytes, list[float]] = {}  # ident -> [tokens, stamp]

    def take(self, ident: bytes, now: float) -> bool:
        """Whether `ident` may be answered now (one token taken if so)."""
        b = self._buckets.get(ident)
        if b is None:
            if len(self._buckets) >= MAX_TRACKED:
                del self._buckets[next(iter(self._buckets))]
            b = self._buckets[ident] = [self.burst, now]
        b[0] = min(self.burst, b[0] + (now - b[1]) * self.rate)
        b[1] = now
        if b[0] < 1.0:
            return False
        b[0] -= 1.0
        return True

    def forget(self, ident: bytes) -> None:
        """The connection is gone."""
        self._buckets.pop(ident, None)
