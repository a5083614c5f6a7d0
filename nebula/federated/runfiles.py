"""The two files through which `nebula fl status|stop` speak to a running federated job, in its controller's
directory: the status file the controller (or FedOptima/OWL server) rewrites as the run goes, and the stop request.

The status file is replaced atomically (written beside, then renamed), so a reader never sees half a document.
A stop request is an empty-ish file; each run clears an earlier run's request when it starts.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable

from security._files import PUBLIC, atomic_write

__all__ = ["RunFiles", "STATUS_FILE", "STOP_FILE"]

STATUS_FILE = "status.json"
STOP_FILE = "STOP"


class RunFiles:
    """The status file and the stop request of the job whose controller keeps its files in `directory`."""

    def __init__(self, directory: str | Path) -> None:
        self.dir = Path(directory)

    @property
    def status_path(self) -> Path:
        return self.dir / STATUS_FILE

    def write_status(self, doc: dict[str, Any]) -> None:
        """Replace the status document (with the time it was written as `updated`)."""
        atomic_write(self.status_path, json.dumps({**doc, "updated": time.time()}).encode(), PUBLIC)

    def read_status(self) -> dict[str, Any] | None:
        """The last status document written, or None before any run wrote one."""
        f = self.status_path
        return json.loads(f.read_text()) if f.exists() else None

    def ask_stop(self) -> None:
        """Ask the running job to stop after the round in progress."""
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / STOP_FILE).write_text(str(time.time()))

    def clear_stop(self) -> None:
        """Forget a stop asked of an earlier run (a run calls this when it starts)."""
        (self.dir / STOP_FILE).unlink(missing_ok=True)

    def stop_asked(self) -> bool:
        """Whether a stop has been asked since the run cleared it."""
        return (self.dir / STOP_FILE).exists()

    def stop_watch(self, every_s: float = 0.5) -> Callable[[], bool]:
        """Clear an earlier run's request and return a cheap `stop_asked` for tight loops: it looks at the file
        no more often than every `every_s` seconds, and stays true once it has seen the request."""
        self.clear_stop()
        seen = {"at": 0.0, "stop": False}

        def asked() -> bool:
            now = time.monotonic()
            if not seen["stop"] and now - seen["at"] >= every_s:
                seen["at"], seen["stop"] = now, self.stop_asked()
            return seen["stop"]

        return asked
