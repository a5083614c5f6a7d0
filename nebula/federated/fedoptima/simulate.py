"""Heterogeneous devices on a virtual clock: FedOptima, synchronous FedAvg and offloading without auxiliary
networks (OAFL: SplitFed-style offloading with FedAsync aggregation), each training for real, timed as modelled.

Every actor runs as a coroutine on one event clock. Real Paddle training happens at every step (so accuracy is
real), but each step *takes* the time the cost model gives: FLOPs / (device FLOP/s / slowdown) for compute and
bytes / bandwidth for every transfer, one transfer at a time per link direction. Idle time is what each actor
spends not computing, out of the same virtual wall time for every method. This is how the benchmark gets
heterogeneous devices (the paper's Raspberry Pi groups at different clock rates) on one shared machine; the
integration tests run the same engines as real processes through switch servers.

`SimSetting(train=False)` keeps the protocol, the messages and the cost model but leaves out the Paddle steps:
the times are the cost model's either way, so idle time and throughput come out the same, and a model whose real
training would take this machine hours (MobileNetV3 on 16 devices) can be timed. Accuracy is then not measured.
"""
from __future__ import annotations

import heapq
import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Generator

import numpy as np

from nebula.federated.aggregate import fedavg
from nebula.federated.fedoptima.auxiliary import default_auxiliary
from nebula.federated.fedoptima.engine import (AsyncAggregator, DeviceTrainer, ServerTrainer, load_state,
                                               split_model, state_of)
from nebula.federated.fedoptima.scheduler import ActivationBatch, ModelUpdate, TaskScheduler
from nebula.federated.fedoptima.split import profile_layers

__all__ = ["SimSetting", "SimResult", "simulate", "METHODS"]

METHODS = ("fedoptima", "fedavg", "oafl")


@dataclass(frozen=True, kw_only=True, slots=True)
class SimSetting:
    """Devices, links and the run: FLOP/s, slowdown factors, bandwidth, batch, iterations per round, wall time."""

    slowdown: tuple[float, ...] = (3.0, 3.0, 1.5, 1.5, 1.5, 1.5, 1.0, 1.0)
    device_flops_per_s: float = 1e9  # the fastest device
    server_flops_per_s: float = 2e10
    bandwidth_bytes_per_s: float = 50e6 / 8  # 50 Mbit/s per device, as Testbed A
    latency_s: float = 0.005
    batch: int = 32
    local_iterations: int = 10  # H
    wall_s: float = 30.0
    omega: int = 8
    split: int = 2
    lr: float = 0.05
    alpha: float = 0.6
    max_delay: int = 16
    train: bool = True  # False: time the protocol without the Paddle steps (accuracy not measured)


@dataclass
class SimResult:
    """What one method measured over the same virtual wall time."""

    method: str
    wall_s: float = 0.0
    server_busy_s: float = 0.0
    device_busy_s: list = field(default_factory=list)
    samples: int = 0  # examples the devices trained on
    accuracy: float | None = None  # None when the run did not train (SimSetting.train False)
    used: list = field(default_factory=list)  # activation batches per device used on the server
    peak_held: int = 0

    @property
    def server_idle_s(self) -> float:
        """Server seconds not computing."""
        return self.wall_s - self.server_busy_s

    @property
    def device_idle_s(self) -> float:
        """Mean over devices of the seconds not computing."""
        return float(np.mean([self.wall_s - b for b in self.device_busy_s]))

    @property
    def throughput(self) -> float:
        """Examples trained on per second."""
        return self.samples / self.wall_s


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self._q: list = []
        self._seq = itertools.count()

    def at(self, t: float, fn: Callable[[], None]) -> None:
        heapq.heappush(self._q, (t, next(self._seq), fn))

    def run(self, until: float) -> None:
        while self._q and self._q[0][0] <= until:
            t, _, fn = heapq.heappop(self._q)
            self.now = t
            fn()
        self.now = until


class _Box:
    """A mailbox: items arrive at a time; a waiting coroutine resumes on arrival."""

    def __init__(self, clock: _Clock) -> None:
        self.clock, self.items, self.waiter = clock, deque(), None
        self.sink: Callable[[Any], None] | None = None  # takes each item on arrival instead of the queue

    def put(self, item: Any) -> None:
        if self.sink is not None:
            self.sink(item)
        else:
            self.items.append(item)
        if self.waiter is not None:
            w, self.waiter = self.waiter, None
            w()


class _Link:
    """One direction of a link: transfers one after another at a bandwidth, plus latency."""

    def __init__(self, clock: _Clock, bw: float, latency: float) -> None:
        self.clock, self.bw, self.latency, self.free = clock, bw, latency, 0.0

    def send(self, box: _Box, item: Any, nbytes: float) -> None:
        start = max(self.clock.now, self.free)
        self.free = start + nbytes / self.bw
        self.clock.at(self.free + self.latency, lambda: box.put(item))


class _Actor:
    """Drives a generator yielding ("compute", seconds) or ("wait", box); counts busy seconds."""

    def __init__(self, clock: _Clock, gen: Generator, until: float) -> None:
        self.clock, self.gen, self.until, self.busy = clock, gen, until, 0.0
        clock.at(0.0, self.step)

    def step(self) -> None:
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


def _train_flops(layers: list, prof: list, input_grad: bool) -> float:
    """Forward plus backward FLOPs per sample of `layers`: the backward pass costs about twice the forward (weight
    and input gradients), less the first weighted layer's input gradient when nothing upstream needs it."""
    total = 3.0 * sum(p.flops for p in prof)
    if input_grad:
        return total
    return total - next((p.flops for layer, p in zip(layers, prof) if list(layer.parameters())), 0.0)


def simulate(method: str, task: Any, s: SimSetting, seed: int = 0) -> SimResult:
    """Run `method` (fedoptima, fedavg or oafl) for `s.wall_s` virtual seconds; measured idle, throughput, accuracy."""
    import paddle

    if method not in METHODS:
        raise ValueError(f"method {method!r} is not one of {', '.join(METHODS)}")
    paddle.seed(seed)
    clock = _Clock()
    k_dev = len(s.slowdown)
    layers = task.layers()
    sample = paddle.to_tensor(task.sample())
    prof = profile_layers(layers, sample)
    # per batch: what each side computes (forward and backward, no input gradient where nothing needs one)
    dev_fwd = s.batch * sum(p.flops for p in prof[: s.split])
    dev_flops = s.batch * _train_flops(layers[: s.split], prof[: s.split], input_grad=False)
    # offloading sends d loss / d activations back: the server's first layer computes its input gradient too
    srv_flops = s.batch * _train_flops(layers[s.split:], prof[s.split:], input_grad=method == "oafl")
    act_bytes = s.batch * prof[s.split - 1].output_bytes
    dev_speed = [s.device_flops_per_s / f for f in s.slowdown]
    res = SimResult(method=method, wall_s=s.wall_s)
    up = [_Link(clock, s.bandwidth_bytes_per_s, s.latency_s) for _ in range(k_dev)]
    down = [_Link(clock, s.bandwidth_bytes_per_s, s.latency_s) for _ in range(k_dev)]
    srv_box = _Box(clock)
    dev_box = [_Box(clock) for _ in range(k_dev)]
    data = [task.batches(k, k_dev) for k in range(k_dev)]
    samples = [0]

    if method == "fedavg":
        full = paddle.nn.Sequential(*layers)
        global_w = state_of(full)
        model_bytes = sum(v.nbytes for v in global_w.values())
        full_flops = s.batch * _train_flops(layers, prof, input_grad=False)
        locals_ = []
        for _ in range(k_dev):
            m = paddle.nn.Sequential(*task.layers())
            locals_.append((m, paddle.optimizer.SGD(learning_rate=s.lr, parameters=m.parameters())))

        def device(k: int):
            m, opt = locals_[k]
            while True:
                yield "wait", dev_box[k]
                load_state(m, dev_box[k].items.popleft())
                for _ in range(s.local_iterations):
                    x, y = next(data[k])
                    if s.train:
                        loss = paddle.nn.functional.cross_entropy(m(paddle.to_tensor(x)),
                                                                  paddle.to_tensor(y.reshape(-1, 1)))
                        loss.backward()
                        opt.step()
                        opt.clear_grad()
                    samples[0] += len(y)
                    yield "compute", full_flops / dev_speed[k]
                up[k].send(srv_box, (k, state_of(m)), model_bytes)

        def server():
            nonlocal global_w
            while True:
                for k in range(k_dev):
                    down[k].send(dev_box[k], global_w, model_bytes)
                got = []
                while len(got) < k_dev:
                    yield "wait", srv_box
                    got.append(srv_box.items.popleft())
                global_w = fedavg([(w, 1) for _, w in sorted(got, key=lambda t: t[0])])
                yield "compute", 2.0 * k_dev * model_bytes / 4 / s.server_flops_per_s

        actors = [_Actor(clock, device(k), s.wall_s) for k in range(k_dev)]
        srv = _Actor(clock, server(), s.wall_s)
        clock.run(s.wall_s)
        load_state(full, global_w)
        parts = [full]
    else:
        dev_net, srv_net = split_model(layers, s.split)
        aux = default_auxiliary(list(dev_net), sample, task.num_classes)
        aux_flops = 3 * s.batch * sum(p.flops for p in profile_layers(list(aux), dev_net(sample)))
        agg = AsyncAggregator(state_of(dev_net), state_of(aux), alpha=s.alpha, max_delay=s.max_delay)
        model_bytes = sum(v.nbytes for v in agg.device.values()) + \
            (sum(v.nbytes for v in agg.aux.values()) if method == "fedoptima" else 0)
        srv_trainer = ServerTrainer(srv_net, lr=s.lr)
        trainers = []
        for _ in range(k_dev):
            d_net, _ = split_model(task.layers(), s.split)
            a_net = default_auxiliary(list(d_net), sample, task.num_classes)
            t = DeviceTrainer(d_net, a_net, lr=s.lr)
            t.load(agg.device, agg.aux)
            trainers.append(t)
        sched = TaskScheduler(devices=list(range(k_dev)), omega=s.omega, clock=lambda: clock.now)  # virtual time

        def send_global(k: int) -> None:
            down[k].send(dev_box[k], ("global", agg.device, agg.aux, agg.version), model_bytes)

        def device(k: int):
            t = trainers[k]
            version, granted = 0, False
            while True:
                for _ in range(s.local_iterations):
                    x, y = next(data[k])
                    samples[0] += len(y)
                    if method == "fedoptima":
                        # the Sender Status as the last iteration left it: a grant may have come in meanwhile
                        while dev_box[k].items and dev_box[k].items[0][0] == "grant":
                            dev_box[k].items.popleft()
                            granted = True
                        h = t.step(x, y)[0] if s.train else None
                        yield "compute", dev_fwd / dev_speed[k]  # Algorithm 1, line 5: the device-side forward
                        if granted:  # line 6: the activations go to the Sender, which uploads them meanwhile
                            up[k].send(srv_box, ActivationBatch(k, (h, y)), act_bytes)
                            granted = False
                        yield "compute", (dev_flops - dev_fwd + aux_flops) / dev_speed[k]  # lines 7-11
                    else:  # offloading: forward, wait for the server's gradient, backward
                        h = t.net(paddle.to_tensor(x)) if s.train else None
                        yield "compute", dev_fwd / dev_speed[k]
                        up[k].send(srv_box, ActivationBatch(k, (h.detach().numpy() if s.train else None, y)),
                                   act_bytes)
                        while True:
                            yield "wait", dev_box[k]
                            msg = dev_box[k].items.popleft()
                            if msg[0] == "grad":
                                break
                        if s.train:
                            h.backward(paddle.to_tensor(msg[1]))
                            t.opt.step()
                            t.opt.clear_grad()
                        yield "compute", (dev_flops - dev_fwd) / dev_speed[k]
                d, a = t.models()
                up[k].send(srv_box, ModelUpdate(k, (d, a), version), model_bytes)
                while True:
                    yield "wait", dev_box[k]
                    msg = dev_box[k].items.popleft()
                    if msg[0] == "grant":
                        granted = True
                    elif msg[0] == "global":
                        break
                t.load(msg[1], msg[2] if method == "fedoptima" else t.models()[1])
                version = msg[3]

        models_q: deque = deque()
        acts_q: deque = deque()
        used = [0] * k_dev

        def next_task():
            if method == "fedoptima":
                return sched.get()  # Algorithm 3
            if models_q:  # offloading serves models first, then activations in arrival order
                return models_q.popleft()
            if acts_q:
                m = acts_q.popleft()
                used[m.origin] += 1
                return m
            return None

        def send_grants() -> None:
            for g in sched.grant():
                down[g].send(dev_box[g], ("grant",), 64)

        def receive(m) -> None:
            # FedOptima's Task Scheduler runs beside the Compute Engine (§V-A: its own thread): it files each
            # message as it arrives (Algorithm 2) and sends the turn-on signal at once (§IV-C)
            sched.put(m)
            send_grants()

        if method == "fedoptima":
            srv_box.sink = receive

        def server():
            if method == "fedoptima":
                send_grants()  # the first turn-on signals
            while True:
                while srv_box.items:  # offloading: models first, then activations in arrival order
                    m = srv_box.items.popleft()
                    (models_q if isinstance(m, ModelUpdate) else acts_q).append(m)
                m = next_task()
                if m is None:
                    yield "wait", srv_box
                    continue
                if method == "fedoptima":
                    send_grants()  # the dequeue freed a slot: its turn-on goes out now, not after this step
                if isinstance(m, ActivationBatch):
                    h, y = m.content
                    grad = srv_trainer.step(h, y, want_grad=(method == "oafl"))[1] if s.train else None
                    yield "compute", srv_flops / s.server_flops_per_s
                    if method == "oafl":
                        down[m.origin].send(dev_box[m.origin], ("grad", grad), act_bytes)
                else:
                    d, a = m.content
                    agg.apply(d, a if method == "fedoptima" else agg.aux, m.version)
                    yield "compute", 2.0 * model_bytes / 4 / s.server_flops_per_s
                    send_global(m.origin)

        actors = [_Actor(clock, device(k), s.wall_s) for k in range(k_dev)]
        srv = _Actor(clock, server(), s.wall_s)
        clock.run(s.wall_s)
        load_state(dev_net, agg.device)
        parts = [dev_net, srv_net]
        res.used = [sched.counters[k] for k in range(k_dev)] if method == "fedoptima" else used
        res.peak_held = sched.peak_held
    res.server_busy_s = srv.busy
    res.device_busy_s = [a.busy for a in actors]
    res.samples = samples[0]
    if s.train:
        x, y = task.test_data()
        with paddle.no_grad():
            h = paddle.to_tensor(x)
            for p in parts:
                h = p(h)
        res.accuracy = float((h.numpy().argmax(-1) == y).mean())
    return res

