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

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Generator

import numpy as np

from nebula.federated.aggregate import fedavg
from nebula.federated.fedoptima.auxiliary import default_auxiliary
from nebula.federated.fedoptima.engine import (AsyncAggregator, DeviceTrainer, ServerTrainer, accuracy, load_state,
                                               split_model, state_of)
from nebula.federated.fedoptima.scheduler import ActivationBatch, ModelUpdate, TaskScheduler
from nebula.federated.fedoptima.split import profile_layers
from nebula.federated.fedoptima.virtual_clock import Mailbox, SimActor, SimLink, VirtualClock

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


def _train_flops(layers: list, prof: list, input_grad: bool) -> float:
    """Forward plus backward FLOPs per sample of `layers`: the backward pass costs about twice the forward (weight
    and input gradients), less the first weighted layer's input gradient when nothing upstream needs it."""
    total = 3.0 * sum(p.flops for p in prof)
    if input_grad:
        return total
    return total - next((p.flops for layer, p in zip(layers, prof) if list(layer.parameters())), 0.0)


@dataclass(frozen=True, slots=True)
class _Costs:
    """The cost model per batch: FLOPs each side computes, bytes of activations on a link, each device's FLOP/s."""

    dev_fwd: float  # the device-side forward
    dev_flops: float  # the device-side forward and backward
    srv_flops: float  # the server-side forward and backward
    act_bytes: float
    dev_speed: tuple[float, ...]


def _costs(method: str, layers: list, prof: list, s: SimSetting) -> _Costs:
    """What one batch costs under `method` at split point `s.split` (no input gradient where nothing needs one)."""
    return _Costs(
        dev_fwd=s.batch * sum(p.flops for p in prof[: s.split]),
        dev_flops=s.batch * _train_flops(layers[: s.split], prof[: s.split], input_grad=False),
        # offloading sends d loss / d activations back: the server's first layer computes its input gradient too
        srv_flops=s.batch * _train_flops(layers[s.split:], prof[s.split:], input_grad=method == "oafl"),
        act_bytes=s.batch * prof[s.split - 1].output_bytes,
        dev_speed=tuple(s.device_flops_per_s / f for f in s.slowdown))


class _World:
    """What every method runs in: the setting, the clock, one link each way per device, the server's and each
    device's mailbox, each device's data, the cost model, and the examples the devices trained on."""

    def __init__(self, s: SimSetting, clock: VirtualClock, data: list, costs: _Costs) -> None:
        k_dev = len(s.slowdown)
        self.s, self.clock, self.data, self.costs, self.samples = s, clock, data, costs, 0
        self.up = [SimLink(clock, s.bandwidth_bytes_per_s, s.latency_s) for _ in range(k_dev)]
        self.down = [SimLink(clock, s.bandwidth_bytes_per_s, s.latency_s) for _ in range(k_dev)]
        self.srv_box = Mailbox(clock)
        self.dev_box = [Mailbox(clock) for _ in range(k_dev)]


class _FedAvg:
    """Synchronous FedAvg: each device trains the whole model H iterations from the global one and sends it back;
    the server waits for all K, averages, and sends the average to every device."""

    def __init__(self, w: _World, task: Any, layers: list, prof: list) -> None:
        import paddle

        s = w.s
        self.w = w
        self.full = paddle.nn.Sequential(*layers)
        self.global_w = state_of(self.full)
        self.model_bytes = sum(v.nbytes for v in self.global_w.values())
        self.full_flops = s.batch * _train_flops(layers, prof, input_grad=False)
        self.locals = []
        for _ in range(len(s.slowdown)):
            m = paddle.nn.Sequential(*task.layers())
            self.locals.append((m, paddle.optimizer.SGD(learning_rate=s.lr, parameters=m.parameters())))

    def device(self, k: int) -> Generator:
        """Device k: wait for the global model, H local iterations, send the model."""
        import paddle

        w, s = self.w, self.w.s
        m, opt = self.locals[k]
        while True:
            yield "wait", w.dev_box[k]
            load_state(m, w.dev_box[k].items.popleft())
            for _ in range(s.local_iterations):
                x, y = next(w.data[k])
                if s.train:
                    loss = paddle.nn.functional.cross_entropy(m(paddle.to_tensor(x)),
                                                              paddle.to_tensor(y.reshape(-1, 1)))
                    loss.backward()
                    opt.step()
                    opt.clear_grad()
                w.samples += len(y)
                yield "compute", self.full_flops / w.costs.dev_speed[k]
            w.up[k].send(w.srv_box, (k, state_of(m)), self.model_bytes)

    def server(self) -> Generator:
        """The server: the global model to every device, all K models back, their average."""
        w, s = self.w, self.w.s
        k_dev = len(s.slowdown)
        while True:
            for k in range(k_dev):
                w.down[k].send(w.dev_box[k], self.global_w, self.model_bytes)
            got = []
            while len(got) < k_dev:
                yield "wait", w.srv_box
                got.append(w.srv_box.items.popleft())
            self.global_w = fedavg([(m, 1) for _, m in sorted(got, key=lambda t: t[0])])
            yield "compute", 2.0 * k_dev * self.model_bytes / 4 / s.server_flops_per_s

    def finish(self, res: SimResult) -> list:
        """The trained model's layers, in order."""
        load_state(self.full, self.global_w)
        return [self.full]


class _ArrivalOrder:
    """Offloading's server queue: device models first, then activations in arrival order (counted per device)."""

    def __init__(self, k_dev: int) -> None:
        self.models: deque = deque()
        self.acts: deque = deque()
        self.used = [0] * k_dev

    def put(self, m: ActivationBatch | ModelUpdate) -> None:
        (self.models if isinstance(m, ModelUpdate) else self.acts).append(m)

    def get(self) -> ActivationBatch | ModelUpdate | None:
        if self.models:
            return self.models.popleft()
        if self.acts:
            m = self.acts.popleft()
            self.used[m.origin] += 1
            return m
        return None


class _Offloaded:
    """The split model: FedOptima (device-side training with the auxiliary network, activations sent under grants
    from the Task Scheduler, asynchronous aggregation) or OAFL (the device waits for the server's gradient every
    iteration; its queue serves models first, then activations as they came)."""

    def __init__(self, method: str, w: _World, task: Any, layers: list, sample: Any, prof: list) -> None:
        s, k_dev = w.s, len(w.s.slowdown)
        self.w, self.fedoptima = w, method == "fedoptima"
        self.dev_net, self.srv_net = split_model(layers, s.split)
        aux = default_auxiliary(list(self.dev_net), sample, task.num_classes)
        self.aux_flops = 3 * s.batch * sum(p.flops for p in profile_layers(list(aux), self.dev_net(sample)))
        self.agg = AsyncAggregator(state_of(self.dev_net), state_of(aux), alpha=s.alpha, max_delay=s.max_delay)
        self.model_bytes = sum(v.nbytes for v in self.agg.device.values()) + \
            (sum(v.nbytes for v in self.agg.aux.values()) if self.fedoptima else 0)
        self.srv_trainer = ServerTrainer(self.srv_net, lr=s.lr)
        self.trainers = []
        for _ in range(k_dev):
            d_net, _ = split_model(task.layers(), s.split)
            a_net = default_auxiliary(list(d_net), sample, task.num_classes)
            t = DeviceTrainer(d_net, a_net, lr=s.lr)
            t.load(self.agg.device, self.agg.aux)
            self.trainers.append(t)
        self.sched = TaskScheduler(devices=list(range(k_dev)), omega=s.omega, clock=lambda: w.clock.now)  # virtual
        self.queue = self.sched if self.fedoptima else _ArrivalOrder(k_dev)  # Algorithm 3, or arrival order
        self.granted = [False] * k_dev  # each device's Sender Status
        if self.fedoptima:
            w.srv_box.sink = self._receive

    # ---- devices ----
    def device(self, k: int) -> Generator:
        """Device k: H iterations, its models to the server, the next global models."""
        w, t, version = self.w, self.trainers[k], 0
        iteration = self._fedoptima_iteration if self.fedoptima else self._offloaded_iteration
        while True:
            for _ in range(w.s.local_iterations):
                x, y = next(w.data[k])
                w.samples += len(y)
                yield from iteration(k, t, x, y)
            d, a = t.models()
            w.up[k].send(w.srv_box, ModelUpdate(k, (d, a), version), self.model_bytes)
            msg = yield from self._await_global(k)
            t.load(msg[1], msg[2] if self.fedoptima else t.models()[1])
            version = msg[3]

    def _fedoptima_iteration(self, k: int, t: DeviceTrainer, x: Any, y: Any) -> Generator:
        """Algorithm 1, lines 5-11: forward, activations to the Sender when granted, the local loss's backward."""
        w, c = self.w, self.w.costs
        # the Sender Status as the last iteration left it: a grant may have come in meanwhile
        while w.dev_box[k].items and w.dev_box[k].items[0][0] == "grant":
            w.dev_box[k].items.popleft()
            self.granted[k] = True
        h = t.step(x, y)[0] if w.s.train else None
        yield "compute", c.dev_fwd / c.dev_speed[k]  # Algorithm 1, line 5: the device-side forward
        if self.granted[k]:  # line 6: the activations go to the Sender, which uploads them meanwhile
            w.up[k].send(w.srv_box, ActivationBatch(k, (h, y)), c.act_bytes)
            self.granted[k] = False
        yield "compute", (c.dev_flops - c.dev_fwd + self.aux_flops) / c.dev_speed[k]  # lines 7-11

    def _offloaded_iteration(self, k: int, t: DeviceTrainer, x: Any, y: Any) -> Generator:
        """Offloading: forward, wait for the server's gradient, backward."""
        import paddle

        w, c = self.w, self.w.costs
        h = t.net(paddle.to_tensor(x)) if w.s.train else None
        yield "compute", c.dev_fwd / c.dev_speed[k]
        w.up[k].send(w.srv_box, ActivationBatch(k, (h.detach().numpy() if w.s.train else None, y)), c.act_bytes)
        while True:
            yield "wait", w.dev_box[k]
            msg = w.dev_box[k].items.popleft()
            if msg[0] == "grad":
                break
        if w.s.train:
            h.backward(paddle.to_tensor(msg[1]))
            t.opt.step()
            t.opt.clear_grad()
        yield "compute", (c.dev_flops - c.dev_fwd) / c.dev_speed[k]

    def _await_global(self, k: int) -> Generator:
        """Wait for the global models (a grant meanwhile turns the Sender on); the "global" message."""
        box = self.w.dev_box[k]
        while True:
            yield "wait", box
            msg = box.items.popleft()
            if msg[0] == "grant":
                self.granted[k] = True
            elif msg[0] == "global":
                return msg

    # ---- the server ----
    def _send_grants(self) -> None:
        for g in self.sched.grant():
            self.w.down[g].send(self.w.dev_box[g], ("grant",), 64)

    def _receive(self, m: ActivationBatch | ModelUpdate) -> None:
        # FedOptima's Task Scheduler runs beside the Compute Engine (§V-A: its own thread): it files each
        # message as it arrives (Algorithm 2) and sends the turn-on signal at once (§IV-C)
        self.sched.put(m)
        self._send_grants()

    def server(self) -> Generator:
        """The server: the next task from its queue, a batch trained on or a device's models aggregated."""
        w = self.w
        if self.fedoptima:
            self._send_grants()  # the first turn-on signals
        while True:
            while w.srv_box.items:  # offloading: models first, then activations in arrival order
                self.queue.put(w.srv_box.items.popleft())
            m = self.queue.get()
            if m is None:
                yield "wait", w.srv_box
                continue
            if self.fedoptima:
                self._send_grants()  # the dequeue freed a slot: its turn-on goes out now, not after this step
            if isinstance(m, ActivationBatch):
                yield from self._train(m)
            else:
                yield from self._aggregate(m)

    def _train(self, m: ActivationBatch) -> Generator:
        w, oafl = self.w, not self.fedoptima
        h, y = m.content
        grad = self.srv_trainer.step(h, y, want_grad=oafl)[1] if w.s.train else None
        yield "compute", w.costs.srv_flops / w.s.server_flops_per_s
        if oafl:
            w.down[m.origin].send(w.dev_box[m.origin], ("grad", grad), w.costs.act_bytes)

    def _aggregate(self, m: ModelUpdate) -> Generator:
        w, agg = self.w, self.agg
        d, a = m.content
        agg.apply(d, a if self.fedoptima else agg.aux, m.version)
        yield "compute", 2.0 * self.model_bytes / 4 / w.s.server_flops_per_s
        w.down[m.origin].send(w.dev_box[m.origin], ("global", agg.device, agg.aux, agg.version), self.model_bytes)

    def finish(self, res: SimResult) -> list:
        """The trained model's layers, in order; the batches used per device and the most held at once."""
        load_state(self.dev_net, self.agg.device)
        k_dev = len(self.w.s.slowdown)
        res.used = [self.sched.counters[k] for k in range(k_dev)] if self.fedoptima else self.queue.used
        res.peak_held = self.sched.peak_held
        return [self.dev_net, self.srv_net]


def simulate(method: str, task: Any, s: SimSetting, seed: int = 0) -> SimResult:
    """Run `method` (fedoptima, fedavg or oafl) for `s.wall_s` virtual seconds; measured idle, throughput, accuracy."""
    import paddle

    if method not in METHODS:
        raise ValueError(f"method {method!r} is not one of {', '.join(METHODS)}")
    paddle.seed(seed)
    clock = VirtualClock()
    layers = task.layers()
    sample = paddle.to_tensor(task.sample())
    prof = profile_layers(layers, sample)
    costs = _costs(method, layers, prof, s)
    w = _World(s, clock, [task.batches(k, len(s.slowdown)) for k in range(len(s.slowdown))], costs)
    run = _FedAvg(w, task, layers, prof) if method == "fedavg" else _Offloaded(method, w, task, layers, sample, prof)
    devices = [SimActor(clock, run.device(k), s.wall_s) for k in range(len(s.slowdown))]
    server = SimActor(clock, run.server(), s.wall_s)
    clock.run(s.wall_s)
    res = SimResult(method=method, wall_s=s.wall_s)
    parts = run.finish(res)
    res.server_busy_s = server.busy
    res.device_busy_s = [a.busy for a in devices]
    res.samples = w.samples
    if s.train:
        res.accuracy = accuracy(parts, *task.test_data())
    return res
