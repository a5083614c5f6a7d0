"""Durable switch state in `state_dir`: who runs it (a lock), boot epoch, status snapshot, pinned peer audit keys."""
from __future__ import annotations

__all__ = ["LOCK_FILE", "SwitchState", "running_pid", "state_dir"]

import errno
import fcntl
import json
import os
import time
from pathlib import Path
from typing import Any

from nebula.config import SwitchConfig
from security import atomic_write
from switch_server.errors import SwitchError

LOCK_FILE = "switch.pid"  # locked by the switch that runs on this state directory, and holding its pid
LOCK_WAIT_S = 1.0  # (`nebula-switch reload` holds the lock for an instant while it looks)


def state_dir(cfg: SwitchConfig) -> Path:
    """The state directory of a switch: `state_dir` from its config, else `state/` beside its audit log."""
    return Path(cfg.state_dir) if cfg.state_dir else Path(cfg.audit.log).parent / "state"


class SwitchState:
    """Small JSON files under `state_dir`, written atomically so a kill -9 never leaves half a file."""

    def __init__(self, state_dir: str | Path) -> None:
        self.dir = Path(state_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock_fd: int | None = None

    def lock(self, cluster: str, config: str | Path | None) -> None:
        """Take the state directory for this process (held until it exits or `unlock`); SwitchError naming the
        running switch's pid and the fix if another process has it."""
        fd = os.open(self.dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EACCES) or time.monotonic() > deadline:
                    pid = _pid_in(fd)
                    os.close(fd)
                    where = f"--config {config}" if config else "--config FILE"
                    raise SwitchError(f"switch {cluster} is already running (pid {pid or '?'}, state directory "
                                      f"{self.dir}); stop it first (kill {pid or 'PID'}), or apply changes to it "
                                      f"live with `nebula-switch reload {where}`") from None
                time.sleep(0.05)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    def unlock(self) -> None:
        """Give the state directory up (the process is about to exit)."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # (closing releases the lock)
            self._lock_fd = None

    def next_epoch(self) -> int:
        """Increment and persist the boot epoch; peers and workers use it to detect a restart."""
        path = self.dir / "epoch"
        try:
            epoch = int(path.read_text().strip() or 0)
        except FileNotFoundError:
            epoch = 0
        except ValueError as exc:
            raise ValueError(f"{path}: corrupt epoch file ({exc}); delete it to start over") from exc
        epoch += 1
        atomic_write(path, f"{epoch}\n".encode())
        return epoch

    def read_json(self, name: str, default: Any = None) -> Any:
        """Load `name` (JSON) or return `default` if it does not exist."""
        try:
            return json.loads((self.dir / name).read_text())
        except FileNotFoundError:
            return default

    def write_json(self, name: str, value: Any) -> None:
        """Persist `value` as `name` atomically."""
        atomic_write(self.dir / name, json.dumps(value, indent=1, sort_keys=True).encode())


def _pid_in(fd: int) -> int | None:
    try:
        return int(os.pread(fd, 32, 0).decode().strip() or 0) or None
    except (OSError, ValueError):
        return None


def running_pid(state_dir: str | Path) -> int | None:
    """The pid of the switch running on `state_dir`, or None when none holds its lock."""
    path = Path(state_dir) / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return _pid_in(fd)  # (held: a switch runs)
        return None
    finally:
        os.close(fd)
