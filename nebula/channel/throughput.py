"""Link throughput from acknowledgements: bytes delivered per second of busy link time, net of the round trip."""
from __future__ import annotations

import threading

__all__ = ["ThroughputMeter"]


class ThroughputMeter:
    """Estimates the bytes/s a link delivers from (bytes, first frame sent, acknowledged) of each message.

    Deliveries whose [sent, acknowledged] intervals overlap form one busy period; a period that carried at least
    `min_bytes` (or several smaller ones pooled) gives one sample, bytes / (duration - latency), where latency is the shortest delivery of a message
    smaller than `min_bytes` (what a message costs beyond its bytes: the round trip and the acknowledgement delay;
    0 until such a message was seen). A period is cut once it spans
    `window_s`, so a link that never idles still yields samples. Samples are smoothed with an exponential moving
    average of weight `alpha`. Thread-safe: the channel's I/O thread records, others read.
    """

    def __init__(self, *, alpha: float = 0.3, min_bytes: int = 16384, window_s: float = 0.5) -> None:
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha={alpha!r} must be in (0, 1]; 1 keeps only the latest busy period")
        if min_bytes < 1:
            raise ValueError(f"min_bytes={min_bytes!r} must be >= 1")
        if not window_s > 0:
            raise ValueError(f"window_s={window_s!r} must be > 0 seconds")
        self.alpha, self.min_bytes, self.window_s = alpha, min_bytes, window_s
        self._lock = threading.Lock()
        self._latency: float | None = None
        self._period: list[float] | None = None  # [start, end, bytes] of the busy period being filled
        self._pool = [0.0, 0.0]  # bytes and transfer seconds of ended periods not yet in a sample
        self._rate: float | None = None
        self.samples = 0

    def record(self, nbytes: int, sent_at: float, acked_at: float) -> None:
        """One message of `nbytes` whose first frame left at `sent_at` was acknowledged at `acked_at` (monotonic s)."""
        if acked_at < sent_at:
            return  # clock misuse: not a delivery
        with self._lock:
            took = acked_at - sent_at
            if nbytes < self.min_bytes:  # a large message's delivery is mostly its transfer, not the round trip
                self._latency = took if self._latency is None else min(self._latency, took)
            p = self._period
            if p is not None and sent_at <= p[1]:
                p[1] = max(p[1], acked_at)
                p[2] += nbytes
                if p[1] - p[0] >= self.window_s and p[2] >= self.min_bytes:
                    self._close(p)
                    self._period = None
                return
            if p is not None:
                self._close(p)
            self._period = [sent_at, acked_at, float(nbytes)]

    def _close(self, p: list[float]) -> None:
        start, end, nbytes = p
        # busy periods smaller than min_bytes (small messages with idle gaps between them) are pooled until the
        # pool holds min_bytes: one round trip per period is taken out, so the pool holds transfer time only
        self._pool[0] += nbytes
        self._pool[1] += max(end - start - (self._latency or 0.0), 0.0)
        if self._pool[0] < self.min_bytes or self._pool[1] <= 0:
            return
        rate = self._pool[0] / self._pool[1]
        self._pool = [0.0, 0.0]
        self._rate = rate if self._rate is None else (1 - self.alpha) * self._rate + self.alpha * rate
        self.samples += 1

    @property
    def bytes_per_s(self) -> float | None:
        """The smoothed estimate (None until a busy period of at least min_bytes has ended)."""
        with self._lock:
            return self._rate
