"""Real child processes for tests and benchmarks, each in its own process group, all killed at the end."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

__all__ = ["BIN", "REPO", "Procs"]

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent  # console scripts of this environment (nebula, nebula-switch, nebula-admin)


class Procs:
    """Starts real child processes in their own process group and kills every one at `reap()`."""

    def __init__(self) -> None:
        self.children: list[subprocess.Popen] = []

    def start(self, args: list[str], **kwargs) -> subprocess.Popen:
        """Start `args`; stdout and stderr together as text on a pipe unless `stdout`/`stderr` say otherwise."""
        env = dict(os.environ, **kwargs.pop("env", {}))
        env.setdefault("PYTHONUNBUFFERED", "1")
        # Children may import code of the checkout that no package installs (`tests.*`, `benchmarks.*`, e.g. a job
        # file's `task: module:factory`): the checkout's root goes first on their path.
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

    def stop(self, proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout_s: float = 10.0) -> int:
        """Signal `proc`'s process group and wait for it (SIGKILL after `timeout_s`); its exit code."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            return proc.wait(timeout=timeout_s)

    def reap(self) -> None:
        """Kill every child still running (its whole process group) and close its pipes."""
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
