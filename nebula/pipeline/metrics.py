"""Per-step metrics of one rank as JSON lines (compute, link wait, bytes, codec time, loss)."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Sequence, TextIO

__all__ = ["MetricsWriter", "read_metrics", "boundary_fields"]


class MetricsWriter:
    """Appends one JSON object per step to ``<dir>/<cluster>.rank<r>.jsonl`` (no file when dir is None)."""

    def __init__(self, directory: str | None, cluster: str, rank: int) -> None:
        self.path: Path | None = None
        self._f: TextIO | None = None
        if directory:
            self.path = Path(directory) / f"{cluster}.rank{rank}.jsonl"
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._f = self.path.open("a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        """Write one step's record and flush (a crash loses at most the current step)."""
        if self._f is not None:
            self._f.write(json.dumps(record, sort_keys=True) + "\n")
            self._f.flush()

    def close(self) -> None:
        """Close the file."""
        if self._f is not None:
            self._f.close()
            self._f = None


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All records of a metrics file, in order."""
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def boundary_fields(boundaries: Sequence[Any], step_s: float, extra_wait_s: float = 0.0) -> dict[str, Any]:
    """A step's record fields from this rank's boundaries (their counters are taken: the next step starts at 0):
    time waiting on peers, compute, bytes and messages each way, codec time, the slowest link's throughput."""
    wait = sum(b.wait_s for b in boundaries) + extra_wait_s
    stats = [b.stats.take() for b in boundaries]
    rates = [r for r in (b.outbox.link.throughput_bytes_per_s() for b in boundaries) if r]
    return {
        "step_s": round(step_s, 6), "wait_s": round(wait, 6), "compute_s": round(max(step_s - wait, 0.0), 6),
        "bytes_sent": sum(s.bytes_sent for s in stats), "bytes_recv": sum(s.bytes_recv for s in stats),
        # boundary messages sent, taken by this step, and delivered twice (each step's messages are the peer's
        # of the same step, or of oneway.sync_lag + 1 steps before for a one-way sender's sync tensors)
        "messages_sent": sum(s.messages_sent for s in stats), "messages_recv": sum(s.messages_recv for s in stats),
        "messages_dup": sum(s.messages_dup for s in stats),
        "raw_bytes_sent": sum(s.raw_bytes_sent for s in stats),
        "codec_s": round(sum(s.codec_s for s in stats), 6),
        # bytes this rank's activation-delta caches hold (nebula.compress.delta), beside its model in memory
        "cache_bytes": sum(getattr(b, "cache_bytes", 0) for b in boundaries),
        "link_bytes_per_s": round(min(rates), 1) if rates else None,  # the lowest measured (None: none yet)
        "time": time.time(),
    }
