"""The future `Channel.send` returns: a `concurrent.futures.Future` that makes its lock only once someone looks.

Most sends' futures are never waited on, or only after they have completed, and a Future's condition (an RLock,
a deque and half a dozen bound methods, made in `__init__`) was the largest part of a small send's cost on the
caller's thread. Here the condition is made when first needed: by a waiter, a callback, `concurrent.futures.wait`,
or a completion that finds one of those there. Every other method is the standard library's.
"""
from __future__ import annotations

__all__ = ["SendFuture"]

import threading
from concurrent.futures import Future, InvalidStateError
from concurrent.futures._base import CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED, RUNNING
from typing import Any

_DONE = (CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED)
# serialises a future's first look at its condition with a completion that finds none: a completion either sees
# the condition (and notifies through it) or happens before it exists (and the first look sees the result)
_FIRST_LOOK = threading.Lock()


class SendFuture(Future):
    """A running future whose condition is made on first use (see the module's docstring)."""

    def __init__(self) -> None:  # (Future.__init__'s fields, less the condition; a send is already running)
        self._cond: threading.Condition | None = None
        self._state = RUNNING
        self._result: Any = None
        self._exception: BaseException | None = None
        self._waiting: list[Any] | None = None  # (`_waiters`, made on first use)
        self._callbacks: list[Any] | None = None  # (`_done_callbacks`, made on first use)

    @property
    def _condition(self) -> threading.Condition:  # type: ignore[override]
        cond = self._cond
        if cond is None:
            with _FIRST_LOOK:
                if self._cond is None:
                    self._cond = threading.Condition()
                cond = self._cond
        return cond

    # the lists Future.__init__ makes are made on first use too: thousands of a stream's futures wait for their
    # acknowledgement at once, and two lists each were most of what the cyclic collector had to visit for them.
    # The standard library touches them under the condition, or (`_invoke_callbacks`) after a completion that a
    # callback added under it had to see.
    @property
    def _waiters(self) -> list[Any]:
        if self._waiting is None:
            self._waiting = []
        return self._waiting

    @property
    def _done_callbacks(self) -> list[Any]:
        if self._callbacks is None:
            self._callbacks = []
        return self._callbacks

    def done(self) -> bool:
        return self._state in _DONE

    def set_result(self, result: Any) -> None:
        if self._cond is None and self._complete(result, None):
            return
        super().set_result(result)

    def set_exception(self, exception: BaseException | None) -> None:
        if self._cond is None and self._complete(None, exception):
            return
        super().set_exception(exception)

    def _complete(self, result: Any, exception: BaseException | None) -> bool:
        """Complete without a condition if no one has looked yet (so none waits and no callback is due)."""
        with _FIRST_LOOK:
            if self._cond is not None:
                return False
            if self._state in _DONE:
                raise InvalidStateError(f"{self._state}: the send's future is already done")  # (no repr: it locks)
            self._result, self._exception, self._state = result, exception, FINISHED
            return True
