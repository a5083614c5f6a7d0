"""Shared fixtures: a reaper for every child process a test starts, and small helpers."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


class Procs:
    """Starts real child processes in their own process group and kills every one at teardown."""

    def __init__(self) -> None:
        self.children: list[subprocess.Popen] = []

    def start(self, args: list[str], **kwargs) -> subprocess.Popen:
        env = dict(os.environ, **kwargs.pop("env", {}))
        env.setdefault("PYTHONUNBUFFERED", "1")
        # Children may import test helpers (`tests.*`, e.g. a job file's `task: module:factory`), which the
        # installed package does not carry: the checkout's root goes first on their path.
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
        kwargs.setdefault("stdout", subprocess.PIPE)
        kwargs.setdefault("stderr", subprocess.STDOUT)
        kwargs.setdefault("text", True)
        proc = subprocess.Popen(args, env=env, start_new_session=True, **kwargs)
        self.children.append(proc)
        return proc

    def python(self, *args: str, **kwargs) -> subprocess.Popen:
        """Start `python ARGS...` with this interpreter."""
        return self.start([sys.executable, *args], **kwargs)

    def reap(self) -> None:
        for proc in self.children:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.children:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()


@pytest.fixture
def procs():
    """Start real subprocesses; all of them (and their process groups) are killed after the test."""
    p = Procs()
    try:
        yield p
    finally:
        p.reap()
