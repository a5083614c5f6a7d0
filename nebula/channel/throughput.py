"""Link throughput from acknowledgements: bytes delivered per second of busy link time, net of the round trip."""
from __future__ import annotations

import threading
from dataclasses import dataclass

__all__ = ["ThroughputMeter"]


@dataclass(slots=True)
class _Period:
    """One busy period: its span, bytes, message count, and where its acknowledgement clock starts."""

    start: float
    end: float
    nbytes: float
    continued: bool = False  # cut from a longer busy period: clocked from the cut, every later byte counts
    count: int = 1
    first_ack: float = 0.0  # records arrive in acknowledgement order: the first one's time
    first_bytes: float = 0.0  # and its bytes, which arrived before the clock started

    def __post_init__(self) -> None:
        self.first_ack = self.end
        self.first_bytes = 0.0 if self.continued else self.nbytes

    def add(self, nbytes: float, acked_at: float) -> None:
        """A message that overlapped this period."""
        self.end = max(self.end, acked_at)
        self.nbytes += nbytes
        self.count += 1

    def clocked(self) -> tuple[float, float] | None:
        """(bytes, seconds) by the acknowledgement clock; None for a single message (no clock to read)."""
        if self.continued or self.count >= 2:
            return self.nbytes - self.first_bytes, self.end - self.first_ack
        return None


class ThroughputMeter:
    """Estimates the bytes/s a link delivers from (bytes, first frame sent, acknowledged) of each message.

    Deliveries whose [sent, acknowledged] intervals overlap form one busy period. A period of several messages is
    measured by its acknowledgement clock: the bytes acknowledged after its first acknowledgement over the time
    from that acknowledgement to its last, which needs no round-trip estimate (a loaded receiver that acknowledges
    the first messages late inflates every delivery time, not the spacing of the acknowledgements). A period of one
    message gives bytes / (duration - latency), latency being the shortest delivery of a message smaller than
    `small_bytes` (the round trip and the acknowledgement delay; 0 until one was seen). Either way a period counts
    only when the link was the bottleneck in it: at least `min_bytes` and at least `min_transfer_s` of transfer.

    Small messages with idle gaps between them (the ABNet demo's few-kB micro-batches on a 60 Mbit/s link) give no
    sample: their deliveries are the round trip plus scheduling jitter, and bytes over that jitter is a lower bound
    far below the link's rate (a shaper's burst lets them through at once). The estimate then stays None, and an
    adaptive codec keeps its configured bandwidth. Small messages sent faster than the link drains them overlap
    into one busy period and are measured like large ones. A period is cut once it spans `window_s`, so a link
    that never idles still yields samples. The estimate is smoothed bytes over smoothed seconds of the samples,
    each an exponential moving average in which the newest sample keeps weight 1 and the older ones decay by
    1 - `alpha` per sample. Thread-safe: the channel's I/O thread records, others read.
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
        self._period: _Period | None = None  # the busy period being filled
        self._rate: float | None = None
        self._sums: tuple[float, float] | None = None  # smoothed bytes and transfer seconds of the samples
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
            if p is not None and sent_at <= p.end:
                p.add(nbytes, acked_at)
                if p.end - p.start >= self.window_s and p.nbytes >= self.min_bytes:
                    self._close(p)
                    # the link stays busy: the next window is clocked from this acknowledgement on
                    self._period = _Period(p.end, p.end, 0.0, continued=True)
                return
            if p is not None:
                self._close(p)
            self._period = _Period(sent_at, acked_at, nbytes)

    def _close(self, p: _Period) -> None:
        clock = p.clocked()
        nbytes, transfer = clock if clock else (p.nbytes, p.end - p.start - (self._latency or 0.0))
        if p.nbytes < self.min_bytes or transfer < self.min_transfer_s or transfer <= 0 or nbytes <= 0:
            self.skipped += 1  # round trip and jitter, not the link's rate
            return
        # bytes and seconds are smoothed separately, so a period weighs by its length: a short one whose
        # acknowledgements a stalled host released in a clump cannot swing the estimate as much as a long one
        if self._sums is None:
            self._sums = (nbytes, transfer)
        else:
            keep = 1 - self.alpha
            self._sums = (keep * self._sums[0] + nbytes, keep * self._sums[1] + transfer)
        self._rate = self._sums[0] / self._sums[1]
        self.samples += 1

    @property
    def bytes_per_s(self) -> float | None:
        """The smoothed estimate (None until a busy period showed the link's rate)."""
        with self._lock:
            return self._rate
