"""Small file helpers: atomic writes with private permissions, so nothing is ever half-written."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

PRIVATE = 0o600
PUBLIC = 0o644


def atomic_write(path: str | os.PathLike, data: bytes, mode: int = PRIVATE) -> Path:
    """Write `data` to `path` via a temp file in the same directory and os.replace; the file gets `mode`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        # mkstemp creates 0600; chmod before writing so a public file never passes through a wider mode
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path


def read_file(path: str | os.PathLike, what: str, error: type[Exception], fix: str) -> bytes:
    """Read `path`, raising `error` that names `what`, the path and `fix` when it is missing or unreadable."""
    path = Path(path)
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise error(f"{what} {path} does not exist; {fix}") from None
    except OSError as exc:
        raise error(f"{what} {path} cannot be read ({exc.strerror}); {fix}") from None
