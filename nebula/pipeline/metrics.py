"""Per-step metrics of one rank as JSON lines (compute, link wait, bytes, codec time, loss)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TextIO

__all__ = ["MetricsWriter", "read_metrics"]


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
