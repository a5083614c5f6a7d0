"""FedOptima's Task Scheduler (Algorithms 2 and 3) and its activation flow control (grants under the cap ω).

`put()` files a received message: a model combination goes to the model queue, a batch of activations to the
activation queue of the device it came from. `get()` answers the Compute Engine: a queued model first (FIFO),
else activations from the device whose counter c_k (activations of k used so far) is smallest among those with
something queued, so a slow device's few batches are trained on as often as a fast device's many.

Flow control (§IV-C). A device sends activations only while its Sender is on; sending turns it off until the
server's turn-on signal, a *grant*. The paper caps each device's queue at ω; here ω caps every activation the
server holds or has granted, over all devices, so server memory stays fixed whatever the number of devices
(the paper's stated aim, its Eq. 3). A grant reserves a slot; freed slots go to the device that has contributed
least. A grant not answered within `grant_timeout_s` is withdrawn (a device that never reports cannot hold a slot).
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Iterable

__all__ = ["ActivationBatch", "ModelUpdate", "TaskScheduler", "SchedulerError"]

Device = Hashable


class SchedulerError(ValueError):
    """A message the scheduler cannot accept (unknown device, activations without a grant)."""


@dataclass(slots=True)
class ActivationBatch:
    """A batch of activations (with its labels) from device `origin`."""

    origin: Device
    content: Any
    nbytes: int = 0


@dataclass(slots=True)
class ModelUpdate:
    """A device's local models (device-side and auxiliary) and the global version they were trained from."""

    origin: Device
    content: Any
    version: int
    num_examples: int = 1


@dataclass(slots=True)
class _Grant:
    issued_s: float


@dataclass(slots=True)
class TaskScheduler:
    """put()/get() of the paper with the cap ω on held plus granted activations."""

    devices: Iterable[Device]
    omega: int
    grant_timeout_s: float = 60.0
    clock: Callable[[], float] = time.monotonic
    model_queue: deque = field(init=False)
    queues: dict = field(init=False)
    counters: dict = field(init=False)
    grants: dict = field(init=False)
    peak_held: int = field(init=False, default=0)
    expired: list = field(init=False)

    def __post_init__(self) -> None:
        if isinstance(self.omega, bool) or not isinstance(self.omega, int) or self.omega <= 0:
            raise ValueError(f"fedoptima omega={self.omega!r}: the cap on queued activations must be a positive "
                             "integer (e.g. 2 x the number of devices); 0 would never let a device send")
        if self.grant_timeout_s <= 0:
            raise ValueError(f"fedoptima grant_timeout_s={self.grant_timeout_s!r} must be > 0 seconds")
        devs = list(self.devices)
        if not devs:
            raise ValueError("fedoptima needs at least one device")
        if len(set(devs)) != len(devs):
            raise ValueError(f"fedoptima devices {devs} name a device twice; give each device once")
        self.devices = devs
        self.model_queue = deque()
        self.queues = {k: deque() for k in devs}
        self.counters = {k: 0 for k in devs}
        self.grants = {}
        self.expired = []

    # ---- Algorithm 2 ----
    def put(self, m: ActivationBatch | ModelUpdate) -> None:
        """File a received message: models to the model queue, activations to their device's queue."""
        if m.origin not in self.queues:
            raise SchedulerError(f"message from unknown device {m.origin!r}; known: {self.devices}")
        if isinstance(m, ModelUpdate):
            self.model_queue.append(m)
            return
        if not isinstance(m, ActivationBatch):
            raise SchedulerError(f"cannot schedule a {type(m).__name__}; put ActivationBatch or ModelUpdate")
        if self.grants.pop(m.origin, None) is None:
            raise SchedulerError(f"device {m.origin!r} sent activations without a grant; a device sends only after "
                                 "the server's turn-on signal")
        self.queues[m.origin].append(m)
        self.peak_held = max(self.peak_held, self.held)

    # ---- Algorithm 3 ----
    def get(self) -> ActivationBatch | ModelUpdate | None:
        """A queued model (FIFO) first, else activations of the least-used device; None when both are empty."""
        if self.model_queue:
            return self.model_queue.popleft()
        ready = [k for k in self.devices if self.queues[k]]
        if not ready:
            return None
        k = min(ready, key=lambda d: self.counters[d])  # ties: the order devices were given
        self.counters[k] += 1
        return self.queues[k].popleft()

    # ---- flow control ----
    @property
    def held(self) -> int:
        """Activation batches queued on the server now."""
        return sum(len(q) for q in self.queues.values())

    @property
    def reserved(self) -> int:
        """Batches held plus batches granted and not yet received: never more than ω."""
        return self.held + len(self.grants)

    def grant(self, active: Iterable[Device] | None = None) -> list[Device]:
        """Devices to send a turn-on signal to now (least-contributing first), marked as granted."""
        now = self.clock()
        for k, g in list(self.grants.items()):
            if now - g.issued_s > self.grant_timeout_s:
                del self.grants[k]  # the device never answered: free its slot for the others
                self.expired.append(k)
        pool = [k for k in (self.devices if active is None else active) if k in self.queues and k not in self.grants]
        # a device with fewer batches waiting, then fewer batches used, gets the next free slot
        pool.sort(key=lambda d: (len(self.queues[d]), self.counters[d]))
        out = []
        for k in pool:
            if self.reserved >= self.omega:
                break
            self.grants[k] = _Grant(now)
            out.append(k)
        return out

    def withdraw(self, device: Device) -> None:
        """Forget a device that left: its grant and queued batches go, its slots free up."""
        self.grants.pop(device, None)
        if device in self.queues:
            self.queues[device].clear()
