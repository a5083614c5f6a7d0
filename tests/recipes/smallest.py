"""The recipes' printed commands run as printed at their smallest size (NEBULA_SMOKE=1, nebula.smoke): through bash,
as a user types them into a shell (`a & b`, `a && b`, `cd DIR` as the first of a sequence), with the environment
activated, in the directory the README runs them from. Every process a command leaves behind (a switch server
started with `&`) is ended after it."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from nebula import smoke
from testbed.procs import BIN, REPO
from tests.harness.readme import scratch_checkout

__all__ = ["REPO", "Printed", "fresh_paths", "run_smallest", "scratch_checkout", "start_smallest"]


class Printed:
    """One printed command running in a process group of its own; its output goes to files (a background child,
    such as a switch server, keeps a pipe open long after the command returns)."""

    def __init__(self, command: str, cwd: Path, log_dir: Path):
        self.command = command
        log_dir.mkdir(parents=True, exist_ok=True)
        name = f"cmd{len(list(log_dir.glob('cmd*.out')))}"
        self.out, self.err = log_dir / f"{name}.out", log_dir / f"{name}.err"
        env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", smoke.ENV: "1"}
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.proc = subprocess.Popen(["bash", "-c", command], cwd=cwd, env=env, stdout=out, stderr=err,
                                         start_new_session=True)

    def wait(self, timeout_s: float) -> str:
        """The command's stdout once it exited 0 (its stderr's tail in the failure otherwise)."""
        try:
            rc = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.stop()
            pytest.fail(f"{self.command!r} still running after {timeout_s} s: {self._tail()}")
        assert rc == 0, f"{self.command!r} exited {rc}: {self._tail()}"
        return self.out.read_text(errors="replace")

    def both(self) -> str:
        """Everything the command wrote, stdout then stderr (where logging's lines go)."""
        return self.out.read_text(errors="replace") + self.err.read_text(errors="replace")

    def wait_group(self, timeout_s: float) -> None:
        """Wait, after `wait`, for what the command started with `&` to end by itself (a user waits for it too)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                os.killpg(self.proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.5)
        pytest.fail(f"what {self.command!r} started in the background still runs after {timeout_s} s: "
                    f"{self._tail()}")

    def stop(self, timeout_s: float = 30) -> None:
        """End whatever the command left running in its group (TERM, then KILL after `timeout_s`)."""
        for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline:
                if self.proc.poll() is None:  # (reap the leader, or the group never empties)
                    time.sleep(0.1)
                    continue
                try:
                    os.killpg(self.proc.pid, 0)
                except ProcessLookupError:
                    return
                time.sleep(0.1)

    def _tail(self) -> str:
        return (self.out.read_text(errors="replace")[-2000:] + "\n--- stderr ---\n"
                + self.err.read_text(errors="replace")[-3000:])


def start_smallest(command: str, log_dir: Path, cwd: Path = REPO) -> Printed:
    """Start printed `command` at its smallest size; `wait` for it, `stop` what it left."""
    return Printed(command, cwd, log_dir)


def run_smallest(command: str, log_dir: Path, cwd: Path = REPO, timeout_s: float = 900) -> str:
    """Run printed `command` at its smallest size to its end; its stdout, after asserting it exited 0. What it
    started in the background is ended."""
    p = Printed(command, cwd, log_dir)
    try:
        return p.wait(timeout_s)
    finally:
        p.stop()


@contextmanager
def fresh_paths(*paths: Path) -> Iterator[None]:
    """Paths a printed sequence writes (fixed by the README): under /tmp removed before and after; anywhere else (the
    checkout) they must not exist before, so that no one's run is removed, and are removed after."""
    for p in paths:
        if str(p).startswith("/tmp/"):
            _remove(p)
        elif p.exists() or p.is_symlink():
            pytest.fail(f"{p} exists: the printed commands write there; move it away and run the test again")
    try:
        yield
    finally:
        for p in paths:
            _remove(p)


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    elif p.exists() or p.is_symlink():
        p.unlink()
