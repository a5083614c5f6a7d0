"""Link throughput from acknowledgements: bytes delivered per second of busy link time, net of the round trip."""
from __future__ import annotations

import threading

__all__ = ["ThroughputMeter"]


class ThroughputMeter:
    """Estimates the bytes/s a link delivers from (bytes, first frame sent, acknowledged) of each message.

    Deliveries whose [sent, acknowledged] intervals overlap form one busy period. A period gives one sample,
    bytes / (duration - latency), only when the link was the bottleneck in it: it carried at least `min_bytes` and
    its transfer time (duration - latency) is at least `min_transfer_s`. Latency is the shortest delivery of a
    message smaller than `small_bytes` (the round trip and the acknowledgement delay; 0 until one was seen).

    Small messages with idle gaps between them (the ABNet demo's few-kB micro-batches on a 60 Mbit/s link) give no
    sample: their deliveries are the round trip plus scheduling jitter, and bytes over that jitter is a lower bound
    far below the link's rate (a shaper's burst lets them through at once). The estimate then stays None, and an
    adaptive codec keeps its configured bandwidth. Small messages sent faster than the link drains them overlap
    into one busy period and are measured like large ones. A period is cut once it spans `window_s`, so a link
    that never idles still yields samples. Samples are smoothed with an exponential moving average of weight
    `alpha`. Thread-safe: the channel's I/O thread records, others read.
    """

    def __init__(self, *, alpha: float = 0.3, min_bytes: int = 65536, min_transfer_s: float = 0.05,
                 small_bytes: int = 16384, window_s: float = 0.5) -> None:
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha={alpha!r} must be in (0, 1]; 1 keeps only the latest busy period")
        if min_bytes < 1 or small_bytes < 1:
            raise ValueError(f"min_bytes={min_bytes!r} and small_bytes={small_bytes!r} must be >= 1")
        if not min_transfer_s >= 0:
            raise ValueError(f"min_transfer_s={min_transfer_s!r} must be >= 0 seconds")
        if not window_s > min_transfer_s:
            raise ValueError(f"window_s={window_s!r} must be > min_transfer_s={min_transfer_s!r} seconds")
        self.alpha, self.min_bytes, self.min_transfer_s = alpha, min_bytes, min_transfer_s
        self.small_bytes, self.window_s = small_bytes, window_s
        self._lock = threading.Lock()
        self._latency: float | None = None
        # [start, end, bytes, 1 if the round trip is in its span else 0] of the busy period being filled
        self._period: list[float] | None = None
        self._rate: float | None = None
        self.samples = 0
        self.skipped = 0  # busy periods too small or too short to show the link's rate

    def record(self, nbytes: int, sent_at: float, acked_at: float) -> None:
        """One message of `nbytes` whose first frame left at `sent_at` was acknowledged at `acked_at` (monotonic s)."""
        if acked_at < sent_at:
            return  # clock misuse: not a delivery
        with self._lock:
            took = acked_at - sent_at
            if nbytes < self.small_bytes:  # a large message's delivery is mostly its transfer, not the round trip
                self._latency = took if self._latency is None else min(self._latency, took)
            p = self._period
            if p is not None and sent_at <= p[1]:
                p[1] = max(p[1], acked_at)
                p[2] += nbytes
                if p[1] - p[0] >= self.window_s and p[2] >= self.min_bytes:
                    self._close(p)
                    # the link stays busy: the next window starts at this acknowledgement, and its bytes (acknowledged
                    # after it) took exactly its span, with no round trip to take out
                    self._period = [p[1], p[1], 0.0, 0.0]
                return
            if p is not None:
                self._close(p)
            self._period = [sent_at, acked_at, float(nbytes), 1.0]

    def _close(self, p: list[float]) -> None:
        start, end, nbytes, with_latency = p
        transfer = end - start - with_latency * (self._latency or 0.0)
        if nbytes < self.min_bytes or transfer < self.min_transfer_s or transfer <= 0:
            self.skipped += 1  # round trip and jitter, not the link's rate
            return
        rate = nbytes / transfer
        self._rate = rate if self._rate is None else (1 - self.alpha) * self._rate + self.alpha * rate
        self.samples += 1

    @property
    def bytes_per_s(self) -> float | None:
        """The smoothed estimate (None until a busy period showed the link's rate)."""
        with self._lock:
            return self._rate
