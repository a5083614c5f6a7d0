"""Which ranks left a cluster, and why: each rank writes its process id when it starts (`record_rank`), and a watch
beside the launcher notes the ranks whose processes are gone first. paddle.distributed.launch stops a cluster's
other ranks only after it has noticed the first one gone, so the first ranks seen gone are the ones that left.

A rank that stops for a reason it can name (a peer cluster lost or never come, its switch silent or refusing, a
configuration the clusters disagree on) leaves that one line for the launcher (`record_failure`), which prints it
once (`failures`): paddle.distributed.launch would otherwise show the rank's output twice, streamed and again as
the failed rank's log."""
from __future__ import annotations

import os
import threading
from pathlib import Path

from security._files import PUBLIC, atomic_write

__all__ = ["RANK_DIR_ENV", "DepartureWatch", "record_rank", "record_failure", "failures", "failure_codes",
           "clear_failures"]

RANK_DIR_ENV = "NEBULA_RANK_DIR"  # set by the launcher for its ranks
POLL_S = 0.05


def _rank_file(suffix: str) -> Path | None:
    """This rank's file `rank<N>.<suffix>` where the launcher looks (None when not started by the launcher)."""
    where = os.environ.get(RANK_DIR_ENV)
    if not where:
        return None
    path = Path(where) / f"rank{int(os.environ.get('PADDLE_TRAINER_ID', '0'))}.{suffix}"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _write(path: Path, text: str) -> None:
    """Replace `path` at once (written beside it, then renamed): the launcher never reads half a file."""
    atomic_write(path, text.encode(), PUBLIC)


def record_rank() -> Path | None:
    """Write this rank's process id where the launcher's watch looks (nothing when not started by the launcher)."""
    path = _rank_file("pid")
    if path is not None:
        _write(path, str(os.getpid()))
    return path


def record_failure(line: str, code: int | None = None) -> bool:
    """Leave this rank's one-line reason for stopping (and its exit code) to the launcher; False when not started
    by the launcher (then the rank prints it itself)."""
    path = _rank_file("failed")
    if path is not None:
        _write(path, line.replace("\n", " ") + "\n")
        if code is not None:
            _write(path.with_suffix(".code"), f"{int(code)}\n")
    return path is not None


def failures(rank_dir: str | Path) -> list[str]:
    """The reasons the ranks of the last launch left (rank order, each distinct line once)."""
    files = sorted(Path(rank_dir).glob("rank*.failed"), key=lambda f: int(f.stem[4:]) if f.stem[4:].isdigit() else 0)
    lines = [f.read_text().strip() for f in files]
    return list(dict.fromkeys(line for line in lines if line))


def failure_codes(rank_dir: str | Path) -> set[int]:
    """The exit codes the ranks of the last launch recorded with their reasons (none: killed, or crashed)."""
    codes = set()
    for f in Path(rank_dir).glob("rank*.code"):
        try:
            codes.add(int(f.read_text()))
        except (OSError, ValueError):
            continue
    return codes


def clear_failures(rank_dir: str | Path) -> None:
    """Forget the reasons of an earlier launch."""
    for pattern in ("rank*.failed", "rank*.code"):
        for f in Path(rank_dir).glob(pattern):
            f.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    """Whether `pid` runs (an exited process that its parent has not reaped yet counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


class DepartureWatch:
    """Polls the ranks' recorded process ids while a launch runs; `departed` holds the ranks found gone in the
    first poll that found any gone (empty if none was seen to go)."""

    def __init__(self, rank_dir: str | Path, poll_s: float = POLL_S) -> None:
        self.rank_dir = Path(rank_dir)
        self.poll_s = poll_s
        self.departed: tuple[int, ...] = ()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="departure-watch", daemon=True)

    def __enter__(self) -> DepartureWatch:
        self.rank_dir.mkdir(parents=True, exist_ok=True)
        for old in self.rank_dir.glob("rank*.pid"):  # (a previous launch's ranks)
            old.unlink()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _pids(self) -> dict[int, int]:
        out = {}
        for f in self.rank_dir.glob("rank*.pid"):
            try:
                out[int(f.stem[4:])] = int(f.read_text())
            except (OSError, ValueError):  # (being replaced)
                continue
        return out

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            gone = sorted(r for r, pid in self._pids().items() if not _alive(pid))
            if gone:
                self.departed = tuple(gone)
                return
