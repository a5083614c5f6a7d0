"""Starve one process of CPU, as an overloaded machine or a CPU quota does: stop it for STOP_MS of every
RUN_MS + STOP_MS, until killed (the process is left running)."""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import time


def main(pid: int, run_ms: float, stop_ms: float) -> None:
    def resume(*_: object) -> None:
        os.kill(pid, signal.SIGCONT)
        sys.exit(0)

    signal.signal(signal.SIGTERM, resume)
    with contextlib.suppress(ProcessLookupError):  # the starved process ended: so does its throttle
        while True:
            os.kill(pid, signal.SIGSTOP)
            time.sleep(stop_ms / 1000)
            os.kill(pid, signal.SIGCONT)
            time.sleep(run_ms / 1000)


if __name__ == "__main__":
    main(int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]))
