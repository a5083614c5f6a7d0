"""Token buckets for per-peer and per-account rate limits and the link shaper (`link.shape.rate_mbit`)."""
from __future__ import annotations

__all__ = ["TokenBucket", "min_rate"]

import time


class TokenBucket:
    """Classic token bucket in bytes; `rate_mbit` None means unlimited."""

    __slots__ = ("rate", "burst", "tokens", "stamp")

    def __init__(self, rate_mbit: float | None, burst_s: float = 0.05, min_burst_bytes: int = 64 * 1024) -> None:
        self.rate = None if rate_mbit is None else rate_mbit * 1e6 / 8  # bytes per second
        # a short burst keeps the shaped rate smooth while still letting one chunk through at once
        self.burst = 0.0 if self.rate is None else max(self.rate * burst_s, float(min_burst_bytes))
        self.tokens = self.burst
        self.stamp = time.monotonic()

    def set_rate(self, rate_mbit: float | None) -> None:
        """Change the rate in place (hot reload)."""
        fresh = TokenBucket(rate_mbit)
        self.rate, self.burst = fresh.rate, fresh.burst
        self.tokens = min(self.tokens, self.burst)

    def take(self, nbytes: int) -> float:
        """Consume `nbytes`; return how many seconds the caller must wait before sending them (0 = now)."""
        if self.rate is None:
            return 0.0
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        self.tokens -= nbytes
        return 0.0 if self.tokens >= 0 else -self.tokens / self.rate


def min_rate(*rates_mbit: float | None) -> float | None:
    """The smallest of the given rates, ignoring None (None if all are None)."""
    given = [r for r in rates_mbit if r is not None]
    return min(given) if given else None
