"""Small file helpers: the one atomic writer (whole files or none, private unless told otherwise), and reading a
file with a one-line error."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable

PRIVATE = 0o600
PUBLIC = 0o644


def atomic_write(path: str | os.PathLike, data: bytes | Callable[[Path], None], mode: int = PRIVATE,
                 durable: bool = True) -> Path:
    """The one way a file is written whole or not at all: into a temporary file in `path`'s directory (`mode` from
    the start, so a public file never passes through a wider one), flushed to disk, renamed over `path`, and the
    rename flushed too. `data` is the bytes, or a function that writes the temporary file at the path it is given
    (`paddle.save`, `np.savez`). A kill leaves `path` as it was, and at most a `.<name>.*.tmp` file beside it.
    `durable=False` skips the two flushes, for a document rewritten so often that waiting for the disk would slow
    its writer (a kill still leaves it whole; a stopped machine may leave an older one)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode)  # (mkstemp creates 0600)
        if isinstance(data, (bytes, bytearray, memoryview)):
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                if durable:
                    os.fsync(f.fileno())
        else:
            os.close(fd)
            data(Path(tmp))
            if durable:
                sync_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    if durable:
        sync_file(path.parent)  # (the rename itself)
    return path


def sync_file(path: str | os.PathLike) -> None:
    """Flush a file's data, or a directory's entries (renames, unlinks), to disk."""
    fd = os.open(str(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_file(path: str | os.PathLike, what: str, error: type[Exception], fix: str) -> bytes:
    """Read `path`, raising `error` that names `what`, the path and `fix` when it is missing or unreadable."""
    path = Path(path)
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise error(f"{what} {path} does not exist; {fix}") from None
    except OSError as exc:
        raise error(f"{what} {path} cannot be read ({exc.strerror}); {fix}") from None
