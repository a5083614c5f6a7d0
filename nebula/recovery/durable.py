"""Files that a kill cannot leave half written: write to a temporary name, flush to disk, rename into place, and
record each file's SHA-256 in a marker that is itself written the same way, last.

A checkpoint is then committed exactly when its marker exists and every file the marker lists has the digest it
lists: a writer killed at any point leaves either no marker (the step does not count) or the previous files under
their names (a rename is atomic), and a file that changed after the marker was written (a step saved again, a disk
that lost a write) fails its digest instead of loading wrong. Markers written before digests existed (no "files")
are taken as they are.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from security._files import PUBLIC, atomic_write, sync_file

__all__ = ["CheckpointError", "write_atomic", "write_marker", "read_marker", "file_digest", "check_files",
           "check_step", "verified_steps", "listed_digests", "check_listed", "sync_dir", "refuse_once"]

_CHUNK = 1 << 20
_DIGESTS: dict[tuple[str, int, int, int], str] = {}  # (path, inode, size, mtime_ns) -> sha256, this process
_CACHE_MAX = 4096
_REFUSED: set[str] = set()  # problems already logged by refuse_once


class CheckpointError(ValueError):
    """A checkpoint file that is torn, truncated or not the one its marker names."""


def sync_dir(path: str | Path) -> None:
    """Flush a directory's entries (renames, unlinks) to disk."""
    sync_file(path)


def _remove_stale(path: Path) -> None:
    """Temporary files of `path` left by writers that were killed (`atomic_write`'s names)."""
    for old in path.parent.glob(f".{path.name}.*.tmp"):
        old.unlink(missing_ok=True)


def _key(p: Path) -> tuple[str, int, int, int]:
    st = p.stat()
    return str(p), st.st_ino, st.st_size, st.st_mtime_ns


def _remember(key: tuple[str, int, int, int], digest: str) -> None:
    if len(_DIGESTS) >= _CACHE_MAX:
        _DIGESTS.clear()
    _DIGESTS[key] = digest


def file_digest(path: str | Path) -> str:
    """SHA-256 of a file (remembered by inode, size and modification time within this process)."""
    p = Path(path)
    key = _key(p)
    if key not in _DIGESTS:
        h = hashlib.sha256()
        with open(p, "rb") as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
        _remember(key, h.hexdigest())
    return _DIGESTS[key]


def write_atomic(path: str | Path, write: Callable[[Path], None]) -> str:
    """Have `write(tmp)` write the file under a temporary name; it is flushed to disk and renamed to `path`
    (`security._files.atomic_write`, readable by all as the writer's files were); returns its SHA-256. A kill leaves
    `path` as it was (and a temporary file the next write of `path` removes)."""
    path = Path(path)
    _remove_stale(path)
    digests: list[str] = []

    def written(tmp: Path) -> None:
        write(tmp)
        digests.append(file_digest(tmp))

    atomic_write(path, written, PUBLIC)
    _remember(_key(path), digests[0])  # (its own bytes: hashed once, not again when the step is listed)
    return digests[0]


def _canonical(doc: Mapping[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def write_marker(path: str | Path, doc: Mapping[str, Any]) -> None:
    """Write a JSON marker atomically, with the SHA-256 of its own content under "digest"."""
    body = {k: v for k, v in doc.items() if k != "digest"}
    data = json.dumps({**body, "digest": hashlib.sha256(_canonical(body)).hexdigest()}).encode()
    write_atomic(path, lambda tmp: tmp.write_bytes(data))


def read_marker(path: str | Path) -> dict:
    """A marker written by `write_marker` (or an older one without a digest); CheckpointError when it is torn."""
    p = Path(path)
    try:
        doc = json.loads(p.read_bytes())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{p} is unreadable or torn ({type(exc).__name__})") from None
    if not isinstance(doc, dict):
        raise CheckpointError(f"{p} holds {type(doc).__name__}, not a checkpoint marker")
    if "digest" in doc:
        body = {k: v for k, v in doc.items() if k != "digest"}
        if hashlib.sha256(_canonical(body)).hexdigest() != doc["digest"]:
            raise CheckpointError(f"{p} does not match its own digest (damaged after it was written)")
    files = doc.get("files", {})
    if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
        raise CheckpointError(f"{p}: 'files' must map file names to digests")
    return doc


def _inside(base: Path, name: str) -> Path:
    p = base / name
    if os.path.isabs(name) or ".." in Path(name).parts:
        raise CheckpointError(f"{base}: marker names file {name!r} outside its checkpoint")
    return p


def check_files(base: str | Path, files: Mapping[str, str]) -> str | None:
    """None when every file named (relative to `base`) exists with its digest, else what is wrong (one phrase)."""
    base = Path(base)
    for name, want in sorted(files.items()):
        try:
            p = _inside(base, name)
        except CheckpointError as exc:
            return str(exc)
        if not p.is_file():
            return f"{name} is missing"
        if file_digest(p) != want:
            return f"{name} does not have the digest its marker records (torn or rewritten)"
    return None


def check_step(d: str | Path, marker: str, need: Sequence[str]) -> str | None:
    """None when marker `d/marker` reads whole, lists every file named in `need` and every file it lists matches
    its digest (a marker without digests: the files in `need` must exist); else what is wrong ("no marker")."""
    d = Path(d)
    if not (d / marker).is_file():
        return "no marker"
    try:
        doc = read_marker(d / marker)
    except CheckpointError as exc:
        return str(exc)
    if "files" not in doc:  # written before digests: the files must exist
        missing = [n for n in need if not (d / n).is_file()]
        return f"{missing[0]} is missing" if missing else None
    unlisted = [n for n in need if n not in doc["files"]]
    if unlisted:
        return f"{unlisted[0]} is missing" if not (d / unlisted[0]).is_file() else f"{unlisted[0]} is not listed"
    return check_files(d, doc["files"])


def verified_steps(root: str | Path | None, marker: str, need: Callable[[Path], Sequence[str]],
                   log: logging.Logger, who: str) -> list[int]:
    """Steps N of the `step_<N>` directories under `root` whose `marker` verifies (`check_step` with `need(d)`),
    oldest first; a step whose marker exists but does not verify is logged once (naming `who`) and left out."""
    if not root or not Path(root).is_dir():
        return []
    out = []
    for d in Path(root).glob("step_*"):
        try:
            step = int(d.name[5:])
        except ValueError:
            continue
        problem = check_step(d, marker, need(d))
        if problem is None:
            out.append(step)
        elif problem != "no marker":
            refuse_once(log, f"checkpoint {d} of {who} refused: {problem}; an older step is used (remove the "
                             "directory to silence this)")
    return sorted(out)


def listed_digests(markers: Iterable[str | Path]) -> tuple[dict[str, str], bool]:
    """Every file digest listed by the readable markers given, and whether any of them lists digests at all
    (False: markers of an older writer, nothing to check against)."""
    out: dict[str, str] = {}
    any_listed = False
    for m in markers:
        try:
            doc = read_marker(m)
        except CheckpointError:
            continue
        if "files" in doc:
            any_listed = True
            out.update(doc["files"])
    return out, any_listed


def check_listed(base: str | Path, name: str, digests: Mapping[str, str], any_listed: bool) -> None:
    """Before loading file `name` of checkpoint `base`: raise CheckpointError unless its markers list it with the
    digest it has (markers without digests: nothing to check)."""
    if not any_listed:
        return
    if name not in digests:
        raise CheckpointError(f"checkpoint {base}: {name} is not listed by any marker (written by a save that did "
                              "not finish); resume from another step or remove the directory")
    problem = check_files(base, {name: digests[name]})
    if problem:
        raise CheckpointError(f"checkpoint {base}: {problem}; resume from another step or remove the directory")


def refuse_once(log: logging.Logger, problem: str) -> None:
    """Log a refused checkpoint once per process (every start-up lists the checkpoints again)."""
    if problem not in _REFUSED:
        _REFUSED.add(problem)
        log.warning("%s", problem)
