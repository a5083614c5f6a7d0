"""One progress line for every loop that shows one: redrawn in place (`\\r`) on a terminal, and a plain line every
`every` steps (by default a tenth of the run, so a run prints about ten) when the output is a file or a pipe, where
a redrawn bar would be thousands of lines (a rank's log under paddle.distributed.launch, `tee`, CI).

`NEBULA_PROGRESS_EVERY=N` sets `every` for every bar of a process (and of its children: ranks inherit it);
`NEBULA_PROGRESS_EVERY=0` turns the plain lines off (the last one is still printed).
"""
from __future__ import annotations

import math
import os
import sys
import time
from typing import Any, Callable, TextIO

__all__ = ["Progress", "EVERY_ENV", "plain_every", "format_line"]

EVERY_ENV = "NEBULA_PROGRESS_EVERY"
PLAIN_LINES = 10  # about this many plain lines per run when nobody chose `every`
REDRAW_S = 0.1  # a terminal line is redrawn at most this often (a fast loop would spend its time drawing)


def plain_every(total: int | None, override: int | None = None, env: str | None = None) -> int:
    """Steps between two plain lines: `override`, else the environment's value, else a tenth of `total` (at least
    1); 0 means none but the last. A bad environment value names itself and the fix."""
    if override is not None:
        if override < 0:
            raise ValueError(f"progress every={override} must be >= 0 (0: only the last line)")
        return override
    if env is not None and env.strip():
        try:
            value = int(env)
        except ValueError:
            raise ValueError(f"{EVERY_ENV}={env!r} is not a whole number; set it to steps between progress lines "
                             "(0: only the last line) or unset it") from None
        return plain_every(total, value)
    return max(1, math.ceil(total / PLAIN_LINES)) if total else 1


def _seconds(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def format_line(desc: str, n: int, total: int | None, elapsed_s: float, done_here: int,
                postfix: dict[str, Any] | None = None, unit: str = "step") -> str:
    """`desc: n/total steps (p%), r step/s, elapsed m:ss, left m:ss, k=v`; `done_here`: steps this process ran
    (the rate leaves out the steps a hot start skipped)."""
    rate = done_here / elapsed_s if elapsed_s > 0 and done_here else None
    head = f"{desc}: {n}/{total} {unit}s ({100 * n / total:.0f}%)" if total else f"{desc}: {n} {unit}s"
    parts = [head]
    if rate is not None:
        parts.append(f"{rate:.3g} {unit}/s" if rate >= 1 else f"{1 / rate:.3g} s/{unit}")
    parts.append(f"elapsed {_seconds(elapsed_s)}")
    if rate is not None and total and n < total:
        parts.append(f"left {_seconds((total - n) / rate)}")
    parts += [f"{k}={v}" for k, v in (postfix or {}).items()]
    return ", ".join(parts)


class Progress:
    """A loop's progress (`update` after each step, `close` at the end; also a context manager)."""

    def __init__(self, total: int | None, desc: str, *, start: int = 0, stream: TextIO | None = None,
                 every: int | None = None, tty: bool | None = None, unit: str = "step",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.total, self.desc, self.unit, self.clock = total, desc, unit, clock
        self.stream = stream if stream is not None else sys.stderr
        self.tty = tty if tty is not None else bool(getattr(self.stream, "isatty", lambda: False)())
        self.every = plain_every(total, every, os.environ.get(EVERY_ENV))
        self.n = self.start = start
        self.postfix: dict[str, Any] = {}
        self.t0 = clock()
        self._drawn = 0.0  # when the terminal line was last drawn
        self._width = 0  # its length (a shorter redraw blanks the rest)
        self._printed = start  # the step of the last plain line
        self.closed = False

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def line(self) -> str:
        """The line as it would be printed now."""
        return format_line(self.desc, self.n, self.total, self.clock() - self.t0, self.n - self.start, self.postfix,
                           self.unit)

    def set_postfix(self, **values: Any) -> None:
        """Values shown after the counts (e.g. loss=...), from the next line on."""
        self.postfix.update(values)

    def update(self, k: int = 1, **postfix: Any) -> None:
        """`k` more steps done."""
        self.set_to(self.n + k, **postfix)

    def set_to(self, n: int, **postfix: Any) -> None:
        """The count is `n` (e.g. after a recovery took the run back to a checkpoint)."""
        self.n = n
        self.postfix.update(postfix)
        if self.tty:
            now = self.clock()
            if now - self._drawn >= REDRAW_S or (self.total and n >= self.total):
                self._draw(now)
        elif self.every and (n - self._printed >= self.every or n < self._printed) and not self._is_last():
            self._plain()

    def _is_last(self) -> bool:
        return bool(self.total) and self.n >= self.total  # printed by close(), once

    def _draw(self, now: float) -> None:
        text = self.line()
        self.stream.write("\r" + text + " " * max(0, self._width - len(text)))
        self.stream.flush()
        self._drawn, self._width = now, len(text)

    def _plain(self) -> None:
        self.stream.write(self.line() + "\n")
        self.stream.flush()
        self._printed = self.n

    def close(self) -> None:
        """The final line (on a terminal: the redrawn line, ended), unless nothing was done at all."""
        if self.closed:
            return
        self.closed = True
        if self.tty:
            if self.n == self.start and not self._width:  # nothing done, nothing drawn: no line at all
                return
            self._draw(self.clock())
            self.stream.write("\n")
            self.stream.flush()
        elif self.n != self._printed:
            self._plain()
