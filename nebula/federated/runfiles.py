"""The two files through which `nebula fl status|stop` speak to a running federated job, in its controller's
directory: the status file the controller (or FedOptima/OWL server) rewrites as the run goes, and the stop request.

The status file is replaced atomically (written beside, then renamed), so a reader never sees half a document. A
"running" document, rewritten after every round, does not wait for the disk: a killed process leaves the last one
written, and a stopped machine at worst an older one (or, on a file system that renames before it writes, one
`read_status` names as unreadable), which the job's next start replaces; every other state (finished, stopped) is on
disk when `write_status` returns. A stop request is an empty-ish file; each run clears an earlier run's request when
it starts.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable

from security._files import PUBLIC, atomic_write

__all__ = ["RunFiles", "STATUS_FILE", "STOP_FILE", "RUNNING"]

STATUS_FILE = "status.json"
STOP_FILE = "STOP"
RUNNING = "running"  # the state rewritten every round: replaced without waiting for the disk


class RunFiles:
    """The status file and the stop request of the job whose controller keeps its files in `directory`."""

    def __init__(self, directory: str | Path) -> None:
        self.dir = Path(directory)

    @property
    def status_path(self) -> Path:
        return self.dir / STATUS_FILE

    def write_status(self, doc: dict[str, Any]) -> None:
        """Replace the status document (with the time it was written as `updated`); on disk when it returns unless
        its state is RUNNING (see the module's note)."""
        data = json.dumps({**doc, "updated": time.time()}).encode()
        atomic_write(self.status_path, data, PUBLIC, durable=doc.get("state") != RUNNING)

    def read_status(self) -> dict[str, Any] | None:
        """The last status document written, or None before any run wrote one; ValueError naming the file when it
        is not a whole document (left so by a stopped machine)."""
        f = self.status_path
        if not f.exists():
            return None
        try:
            doc = json.loads(f.read_bytes())
        except ValueError:
            doc = None
        if not isinstance(doc, dict):
            raise ValueError(f"status file {f} is not a whole JSON document (the machine stopped while the job "
                             "ran?); start the job again (it rewrites the file) or delete the file")
        return doc

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
