"""A discrete-event clock for the simulated runs (`simulate`): events in time order, mailboxes, links that carry
one transfer at a time, and actors written as coroutines that yield how long they compute or what they wait for.

Nothing here knows FedOptima; an actor's generator yields ("compute", seconds) or ("wait", mailbox), and the
clock runs everything due up to a time. Events due at the same time run in the order they were scheduled.
"""
from __future__ import annotations

import heapq
import itertools
from collections import deque
from typing import Any, Callable, Generator

__all__ = ["VirtualClock", "Mailbox", "SimLink", "SimActor"]


class VirtualClock:
    """Virtual time and the queue of what happens when."""

    def __init__(self) -> None:
        self.now = 0.0
        self._q: list = []
        self._seq = itertools.count()  # same time: first scheduled, first run (the heap never compares callables)

    def at(self, t: float, fn: Callable[[], None]) -> None:
        """Run `fn` at virtual time `t`."""
        heapq.heappush(self._q, (t, next(self._seq), fn))

    def run(self, until: float) -> None:
        """Run every event due up to `until`, then stand at `until`."""
        while self._q and self._q[0][0] <= until:
            t, _, fn = heapq.heappop(self._q)
            self.now = t
            fn()
        self.now = until


class Mailbox:
    """Items arrive at a time; a waiting coroutine resumes on arrival."""

    def __init__(self, clock: VirtualClock) -> None:
        self.clock, self.items, self.waiter = clock, deque(), None
        self.sink: Callable[[Any], None] | None = None  # takes each item on arrival instead of the queue

    def put(self, item: Any) -> None:
        """Deliver `item` now (to the sink, else the queue) and wake the coroutine waiting here, if any."""
        if self.sink is not None:
            self.sink(item)
        else:
            self.items.append(item)
        if self.waiter is not None:
            w, self.waiter = self.waiter, None
            w()


class SimLink:
    """One direction of a link: transfers one after another at a bandwidth, plus latency."""

    def __init__(self, clock: VirtualClock, bw: float, latency: float) -> None:
        self.clock, self.bw, self.latency, self.free = clock, bw, latency, 0.0

    def send(self, box: Mailbox, item: Any, nbytes: float) -> None:
        """Queue `item` (`nbytes` long) behind the transfers already on the link; it lands in `box`."""
        start = max(self.clock.now, self.free)
        self.free = start + nbytes / self.bw
        self.clock.at(self.free + self.latency, lambda: box.put(item))


class SimActor:
    """Drives a generator yielding ("compute", seconds) or ("wait", mailbox); counts busy seconds up to `until`."""

    def __init__(self, clock: VirtualClock, gen: Generator, until: float) -> None:
        self.clock, self.gen, self.until, self.busy = clock, gen, until, 0.0
        clock.at(0.0, self.step)

    def step(self) -> None:
        """Resume the coroutine until it computes (for a time) or waits (on an empty mailbox)."""
        try:
            kind, arg = next(self.gen)
        except StopIteration:
            return
        if kind == "compute":
            end = self.clock.now + arg
            self.busy += max(0.0, min(end, self.until) - self.clock.now)
            self.clock.at(end, self.step)
        elif arg.items:
            self.clock.at(self.clock.now, self.step)
        else:
            arg.waiter = self.step
