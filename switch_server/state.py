"""Durable switch state in `state_dir`: boot epoch, status snapshot, pinned peer audit keys."""
from __future__ import annotations

__all__ = ["SwitchState", "state_dir"]

import json
from pathlib import Path
from typing import Any

from nebula.config import SwitchConfig
from security import atomic_write


def state_dir(cfg: SwitchConfig) -> Path:
    """The state directory of a switch: `state_dir` from its config, else `state/` beside its audit log."""
    return Path(cfg.state_dir) if cfg.state_dir else Path(cfg.audit.log).parent / "state"


class SwitchState:
    """Small JSON files under `state_dir`, written atomically so a kill -9 never leaves half a file."""

    def __init__(self, state_dir: str | Path) -> None:
        self.dir = Path(state_dir)
        self.dir.mkdir(parents=True, exist_ok=True)

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
