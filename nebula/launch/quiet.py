"""What keeps `nebula launch` quiet: paddle.distributed.launch's own log lines go to a file, paddle's import-time
ccache warning is filtered, and a stopped launch says so in one line instead of paddle's C++ traceback block.

The ccache warning is a UserWarning paddle raises on import when ccache is missing (it only matters to someone
compiling paddle's C++ extensions, which no Nebula process does). The C++ traceback block is printed by the
signal handler paddle installs in every process that imports it: a rank stopped by SIGTERM (which is how
paddle.distributed.launch stops its ranks) printed it into its log, and the launcher streamed it to the terminal.
"""
from __future__ import annotations

import contextlib
import signal
import subprocess
import threading
import warnings
from pathlib import Path
from typing import IO, Mapping

__all__ = ["CCACHE_WARNING", "LAUNCH_LOG", "STOPPED_CODES", "silence_paddle_import", "child_env",
           "default_sigterm", "run_stoppable", "signal_name", "launch_log_path"]

CCACHE_WARNING = "No ccache found"  # the start of paddle's message (what a warnings filter matches)
LAUNCH_LOG = "launch.log"  # paddle.distributed.launch's own output, in the launch's log directory
# a launch stopped by a signal to `nebula launch` itself returns 128 + signal (paddle's launcher never does: it
# exits with the bare signal number or its pod's code), so a supervisor can tell "stopped" from "failed"
STOPPED_CODES = (128 + signal.SIGINT, 128 + signal.SIGTERM)


def silence_paddle_import() -> None:
    """Drop paddle's ccache warning in this process (call before paddle is imported)."""
    warnings.filterwarnings("ignore", message=CCACHE_WARNING, category=UserWarning)


def child_env(env: Mapping[str, str]) -> dict[str, str]:
    """`env` for paddle's launcher and its ranks: the ccache warning filtered in each (PYTHONWARNINGS is inherited
    by every Python process below), output unbuffered (a rank's lines reach the terminal as it prints them), paddle's
    C++ INFO lines off unless GLOG_minloglevel is set."""
    out = dict(env)
    rule = f"ignore:{CCACHE_WARNING}:UserWarning"
    have = out.get("PYTHONWARNINGS", "")
    if rule not in have.split(","):
        out["PYTHONWARNINGS"] = f"{have},{rule}" if have else rule
    out.setdefault("PYTHONUNBUFFERED", "1")
    out.setdefault("GLOG_minloglevel", "1")  # paddle's C++ INFO lines (its TCP store's ports): warnings still show
    return out


def default_sigterm() -> None:
    """In a rank: SIGTERM ends the process at once, as paddle's handler did, but without its C++ traceback block
    (nothing went wrong: the launcher is stopping the cluster). Paddle is imported here first: importing it
    installs the handler this replaces (its handlers of crashes, SIGSEGV and the like, stay)."""
    import paddle  # noqa: F401

    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def run_stoppable(cmd: list[str], env: Mapping[str, str], log: IO[str]) -> tuple[int, int | None]:
    """Run `cmd` (paddle's launcher) with its stderr in `log`, its stdout (the ranks' output) on ours; SIGINT or
    SIGTERM to this process stops it (its ranks with it). Returns (its exit code, the signal that stopped it or
    None)."""
    proc = subprocess.Popen(cmd, env=dict(env), stderr=log)
    stopped: list[int] = []

    def stop(signum: int, _frame: object = None) -> None:
        stopped.append(signum)
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)  # paddle's launcher stops its ranks, then exits

    handlers = {}
    if threading.current_thread() is threading.main_thread():  # (signal handlers can only be set there)
        handlers = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while True:
            try:
                code = proc.wait()
                break
            except KeyboardInterrupt:  # (outside the main thread's handlers)
                stop(signal.SIGINT)
    finally:
        for s, old in handlers.items():
            signal.signal(s, old)
    return code, (stopped[0] if stopped else None)


def signal_name(signum: int) -> str:
    """SIGTERM, SIGINT, ..."""
    with contextlib.suppress(ValueError):
        return signal.Signals(signum).name
    return f"signal {signum}"


def launch_log_path(log_dir: str | Path) -> Path:
    """Where paddle.distributed.launch's own output goes for a launch with `log_dir`."""
    return Path(log_dir) / LAUNCH_LOG

