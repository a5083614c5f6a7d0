"""FedOptima over Nebula channels: the server (Task Scheduler, central training, asynchronous aggregation) and a
device (Algorithm 1), each one rank of the job behind its cluster's switch, with measured idle time.

Protocol on the channel `fedoptima` between the server and each device (control lane unless said):
device HELLO {flops_per_s, bandwidth_bytes_per_s} -> server INIT {split} + global models (bulk) and GRANTs;
device ACT + [h, y] (activation lane) only after a GRANT; device MODEL {version} + models (bulk) every H
iterations -> server GLOBAL {version} + models (bulk); server STOP -> device BYE {its idle and busy seconds}.

Fallbacks, never a hang: a device that has not said hello within `join_timeout_s` is left out (none at all is
an error); a grant unanswered for `grant_timeout_s` is withdrawn and that device gets no new one until it is
heard from again (a device that died holds no slot of ω); the server ends the run when no device sent
anything for `idle_timeout_s`; a device that gets no global model within `global_timeout_s` trains on with its
own; after STOP the server waits at most `join_timeout_s` for BYEs and reports the devices that sent none.
A batch of activations holds at most the task's `batch` rows (what the server knows of the devices' batches). Every
wait polls `check_terminated` (SIGTERM ends the actor with its audit record).
"""
from __future__ import annotations

import logging
import queue
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Protocol

import numpy as np

from nebula.channel import ChannelError, Endpoint
from nebula.federated._actor import RefusalSink, check_terminated
from nebula.federated.fedoptima.auxiliary import default_auxiliary
from nebula.federated.fedoptima.config import FedOptimaSpec
from nebula.federated.fedoptima.engine import (AsyncAggregator, DeviceTrainer, ServerTrainer, accuracy, load_state,
                                              split_model, state_of)
from nebula.federated.fedoptima.messages import (TO_DEVICE, TO_SERVER, Activations, AggregatedModel, DeviceBye,
                                                DeviceHello, DeviceModel, Init, SendSlot, Stop)
from nebula.federated.fedoptima.scheduler import ActivationBatch, ModelUpdate, SchedulerError, TaskScheduler
from nebula.federated.fedoptima.split import DeviceInfo, check_split, profile_layers, split_point
from nebula.mean import check_model_update
from nebula.messaging import Messenger, MessageFamily, Peer, ProtocolError, decode, pack_message

__all__ = ["Task", "FedOptimaError", "ServerResult", "serve", "run_device", "CHANNEL"]

log = logging.getLogger(__name__)
CHANNEL = "fedoptima"
# what an actor's caller does with each refusal besides its log line: refused(peer, field, value, expected), e.g.
# an audit record (nebula.federated.actors); the runtime itself writes no file
_FIELD = re.compile(r"(\w+)=(.*?), expected (.*)", re.S)


def _name(who: Any) -> str:
    """A sender as a refusal names it: cluster/rank (a Peer prints so too; a test's name as given)."""
    return "/".join(map(str, who)) if isinstance(who, tuple) else str(who)


def _report(refused: RefusalSink | None, who: Any, why: Any, field: str, expected: str = "", message: str = ""
            ) -> bool:
    """Pass a refusal of a `message` (its type) whose reason reads "name=value, expected ..." to `refused` as (peer,
    name, value, expected); any other reason as (peer, `field`, the reason, `expected` or what follows its
    ", expected "). Whether the refusal gets its log line (False: `refused` counts it as a repeat within its
    interval)."""
    if refused is None:
        return True
    text = str(why)
    m = _FIELD.fullmatch(text)
    if m is not None:
        field, value, expected = m.groups()
    else:
        value, _, rest = text.partition(", expected ")
        expected = expected or rest
    return refused(_name(who), field, value, expected, message=message) is not False


class FedOptimaError(RuntimeError):
    """The run cannot go on (no device joined, the server never answered)."""


class Task(Protocol):
    """What a FedOptima run trains: a sequential model, local data per device (batches of at most `batch`
    examples), held-out data."""

    num_classes: int
    batch: int

    def layers(self) -> list: ...  # a fresh model as a list of Paddle layers (same seed on every rank)

    def sample(self) -> np.ndarray: ...  # a small input batch (profiling, auxiliary network shapes)

    def batches(self, device: int, num_devices: int) -> Iterator[tuple[np.ndarray, np.ndarray]]: ...

    def test_data(self) -> tuple[np.ndarray, np.ndarray]: ...


@dataclass
class ServerResult:
    """What the server measured."""

    wall_s: float = 0.0
    idle_s: float = 0.0
    busy_s: float = 0.0
    split: int = 0
    rounds: int = 0
    aggregations: int = 0
    skipped: int = 0
    server_batches: int = 0
    samples: int = 0
    peak_held: int = 0
    accuracy: float = 0.0
    initial_accuracy: float = 0.0  # the same model before training: the baseline of the learning claim
    used: dict = field(default_factory=dict)  # activation batches trained on, per device
    devices: dict = field(default_factory=dict)  # BYE stats per device
    missing: list = field(default_factory=list)  # devices that never joined or never said BYE
    ended: str = ""


@dataclass(frozen=True, slots=True)
class _Expect:
    """What the server checks a device's messages against once training starts: one sample's activations at the
    split (shape, dtype), the label range, and the aggregator (the versions it issued, the models' tensors)."""

    act_shape: tuple[int, ...]
    act_dtype: str
    num_classes: int
    agg: AsyncAggregator
    max_rows: int = 1 << 30  # a batch's rows: the task's batch (a device sends one batch's activations at a time)

    def activations_refusal(self, arrays: dict) -> str | None:
        """Why a batch of activations is not one the server can train on (None: it is)."""
        if set(arrays) != {"h", "y"}:
            return f"arrays={sorted(arrays)[:4]}, expected ['h', 'y']"
        h, y = arrays["h"], arrays["y"]
        if str(h.dtype) != self.act_dtype or h.ndim < 1 or h.shape[1:] != self.act_shape or not len(h):
            return (f"h={h.dtype}{list(h.shape)[:8]}, expected {self.act_dtype}[batch, "
                    f"{', '.join(map(str, self.act_shape))}] (the device network's output at the split)")
        if len(h) > self.max_rows:
            return f"rows={len(h)}, expected 1..{self.max_rows} (the task's batch)"
        if y.shape != h.shape[:1] or not np.issubdtype(y.dtype, np.integer):
            return f"y={y.dtype}{list(y.shape)[:8]}, expected integer labels [{len(h)}] (one per activation row)"
        if y.min() < 0 or y.max() >= self.num_classes:
            return f"y holds label {int(y.min() if y.min() < 0 else y.max())}, expected 0..{self.num_classes - 1}"
        if not np.isfinite(h).all():
            return "h holds NaN or Inf, expected finite activations"
        return None


def _receiver(mb: Messenger, who: Any, inbox: queue.Queue, stop: threading.Event, piece_timeout_s: float) -> None:
    ch = mb.channel(Peer(*who))
    while not stop.is_set():
        try:
            parts = ch.recv_parts(timeout_s=0.5)
        except TimeoutError:
            continue
        except ChannelError as exc:  # a refusal or an unreachable peer: the main loop decides
            inbox.put((who, None, exc))
            if stop.wait(1.0):
                return
            continue
        try:  # (decoded by the server loop: _decoded)
            inbox.put((who, *mb.receive_arrays(Peer(*who), parts, piece_timeout_s)))
        except (ProtocolError, TimeoutError) as exc:
            inbox.put((who, None, exc))


def serve(ep: Endpoint, devices: list[tuple[str, int]], task: Task, spec: FedOptimaSpec,
          should_stop: Callable[[], bool] | None = None, refused: RefusalSink | None = None) -> ServerResult:
    """Run the server side until E rounds, `duration_s`, silence or `should_stop()`; the measured result. Each
    refusal is logged and passed to `refused`."""
    import paddle

    res = ServerResult()
    mb = Messenger(ep, TO_SERVER, channel=CHANNEL)
    chans = {d: mb.channel(Peer(*d)) for d in devices}
    inbox: queue.Queue = queue.Queue()
    stop = threading.Event()
    threads = [threading.Thread(target=_receiver, args=(mb, d, inbox, stop, spec.global_timeout_s), daemon=True)
               for d in chans]
    for t in threads:
        t.start()
    try:
        return _serve(res, mb, chans, inbox, task, spec, paddle, should_stop or (lambda: False), refused)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=2)


def _serve(res: ServerResult, mb: Messenger, chans: dict, inbox: queue.Queue, task: Task, spec: FedOptimaSpec,
           paddle, should_stop: Callable[[], bool], refused: RefusalSink | None = None) -> ServerResult:
    # ---- initialisation: device information, split point, auxiliary network ----
    hellos = _gather(inbox, DeviceHello, {}, len(chans), spec.join_timeout_s, refused=refused)
    infos = {who: DeviceInfo(flops_per_s=h.flops_per_s, bandwidth_bytes_per_s=h.bandwidth_bytes_per_s)
             for who, h in hellos.items()}
    res.missing = [f"{c}/{r}" for (c, r) in chans if (c, r) not in infos]
    if not infos:
        raise FedOptimaError(f"no device said hello within join_timeout_s={spec.join_timeout_s}; start the devices "
                             "(same job name, channel 'fedoptima') or raise the timeout")
    if res.missing:
        log.warning("devices %s did not join within %.0f s; training without them", res.missing, spec.join_timeout_s)
    active = [d for d in chans if d in infos]
    layers = task.layers()
    sample = paddle.to_tensor(task.sample())
    if spec.split is not None:
        res.split = spec.split
    else:
        res.split = split_point(profile_layers(layers, sample), list(infos.values()))
    dev_net, srv_net = split_model(layers, res.split)
    aux = default_auxiliary(list(dev_net), sample, task.num_classes)
    agg = AsyncAggregator(state_of(dev_net), state_of(aux), alpha=spec.alpha, staleness=spec.staleness,
                          max_delay=spec.max_delay)
    trainer = ServerTrainer(srv_net, lr=spec.lr_server)
    sched = TaskScheduler(devices=active, omega=spec.omega, grant_timeout_s=spec.grant_timeout_s)
    with paddle.no_grad():
        h = dev_net(sample).numpy()
    expect = _Expect(tuple(h.shape[1:]), str(h.dtype), task.num_classes, agg, max_rows=int(task.batch))
    server = _Server(res, mb, chans, inbox, spec, active, agg, trainer, sched, expect, refused)
    for d in active:
        mb.send_model(Peer(*d), Init(split=res.split, version=0), _models(agg.device, agg.aux), lane="bulk",
                      inline=True)
    x_test, y_test = task.test_data()
    res.initial_accuracy = accuracy([dev_net, srv_net], x_test, y_test)

    server.run(should_stop)  # ---- training: Algorithm 4 fed by the Task Scheduler ----

    for d in active:
        chans[d].send(pack_message(Stop()), lane="control")
    byes = _gather(inbox, DeviceBye, server.byes, len(active), spec.join_timeout_s, from_=set(active),
                   refused=refused)
    res.devices = {f"{c}/{r}": bye.stats for (c, r), bye in byes.items()}
    res.missing += [f"{c}/{r}" for (c, r) in active if (c, r) not in byes]
    load_state(dev_net, agg.device)
    res.accuracy = accuracy([dev_net, srv_net], x_test, y_test)
    return res


class _Server:
    """The server's training loop: the Receiver's queue into the scheduler, grants, the Compute Engine's steps, and
    the reasons to end; what it measures goes into `res`."""

    def __init__(self, res: ServerResult, mb: Messenger, chans: dict, inbox: queue.Queue, spec: FedOptimaSpec,
                 active: list, agg: AsyncAggregator, trainer: ServerTrainer, sched: TaskScheduler,
                 expect: _Expect, refused: RefusalSink | None = None) -> None:
        self.res, self.mb, self.chans, self.inbox, self.spec, self.expect = res, mb, chans, inbox, spec, expect
        self.refused = refused
        self.active, self.agg, self.trainer, self.sched = active, agg, trainer, sched
        self.byes: dict = {}  # device -> its BYE (one may come before STOP)
        self.silent: set = set()  # devices whose grant expired unanswered
        self.t0 = self.last_heard = 0.0

    def run(self, should_stop: Callable[[], bool]) -> None:
        """Algorithm 4 until an end (`res.ended` says which); the wall, idle and busy seconds."""
        res, sched = self.res, self.sched
        self.t0 = self.last_heard = time.monotonic()
        while True:
            check_terminated()
            self._drain()
            while sched.expired:  # a grant went unanswered: no more grants until the device is heard from
                self.silent.add(sched.expired.pop())
            self._grant()
            now = time.monotonic()
            res.ended = self._end(now, should_stop)
            if res.ended:
                break
            m = sched.get()
            if m is None:
                if not self._idle(now):
                    break
                continue
            self._work(m)
        res.wall_s = time.monotonic() - self.t0
        res.skipped, res.peak_held = self.agg.skipped, sched.peak_held
        res.used = {f"{c}/{r}": n for (c, r), n in sched.counters.items()}

    def _take(self, who: Any, head: dict | None, arrays: Any) -> None:
        self.last_heard = time.monotonic()
        self.silent.discard(who)  # heard from again: it may be granted again
        _on_message(self.sched, self.res, self.byes, who, head, arrays, self.expect, self.refused)

    def _drain(self) -> None:
        """The Receiver's queue into the scheduler (Algorithm 2)."""
        while True:
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return
            self._take(*item)

    def _grant(self) -> None:
        _send_grants(self.sched, self.chans, [d for d in self.active if d not in self.silent])

    def _end(self, now: float, should_stop: Callable[[], bool]) -> str:
        """Why the run ends now ("" while it goes on): E rounds, duration_s, or a stop asked."""
        spec = self.spec
        if self.res.rounds >= spec.max_rounds:
            return f"{spec.max_rounds} rounds"
        if now - self.t0 >= spec.duration_s:
            return f"duration_s={spec.duration_s}"
        if should_stop():
            return "stop asked"
        return ""

    def _idle(self, now: float) -> bool:
        """Nothing to compute: wait a moment for a message, counted as idle; False when every device went silent."""
        if now - self.last_heard > self.spec.idle_timeout_s:
            self.res.ended = f"no device sent anything for idle_timeout_s={self.spec.idle_timeout_s}"
            log.warning("fedoptima server: %s; ending the run", self.res.ended)
            return False
        w0 = time.monotonic()
        try:
            item = self.inbox.get(timeout=0.05)
        except queue.Empty:
            pass
        else:
            self._take(*item)
        self.res.idle_s += time.monotonic() - w0
        return True

    def _work(self, m: ActivationBatch | ModelUpdate) -> None:
        """One step of the Compute Engine: train on a batch, or aggregate a device's models and send the result."""
        res, agg = self.res, self.agg
        if isinstance(m, ActivationBatch):  # the dequeue freed a slot: its turn-on goes out before this step
            self._grant()
        b0 = time.monotonic()
        if isinstance(m, ActivationBatch):
            h, y = m.content
            self.trainer.step(h, y)
            res.server_batches += 1
            res.samples += len(y)
        else:
            dstate, astate = m.content
            try:
                res.aggregations += int(agg.apply(dstate, astate, m.version, who=str(m.origin)))
            except ValueError as exc:
                if _report(self.refused, m.origin, exc, "model", "a model the aggregator takes", "model"):
                    log.warning("fedoptima server: model from %s rejected: %s", m.origin, exc)
            self.mb.send_model(Peer(*m.origin), AggregatedModel(version=agg.version), _models(agg.device, agg.aux),
                               lane="bulk", inline=True)
            res.rounds = res.aggregations // len(self.active)  # a round is K aggregations (Algorithm 4, line 21)
        res.busy_s += time.monotonic() - b0


def _gather(inbox: queue.Queue, kind: type, into: dict, count: int, timeout_s: float,
            from_: set | None = None, refused: RefusalSink | None = None) -> dict:
    """Messages of type `kind` from the inbox into `into` (device -> message) until it holds `count` devices or
    `timeout_s` has passed; anything else, or from a device not in `from_` (when given), is dropped (a refused
    header logged)."""
    deadline = time.monotonic() + timeout_s
    while len(into) < count and time.monotonic() < deadline:
        check_terminated()
        try:
            who, head, _ = inbox.get(timeout=max(0.01, min(0.5, deadline - time.monotonic())))
        except queue.Empty:
            continue
        msg = _decoded(who, head, refused)
        if isinstance(msg, kind) and (from_ is None or who in from_):
            into[who] = msg
    return into


def _send_grants(sched: TaskScheduler, chans: dict, eligible: list) -> None:
    """Turn-on signals for the slots free under ω (§IV-C: checked when a batch is enqueued or dequeued)."""
    for d in sched.grant(eligible):
        chans[d].send(pack_message(SendSlot()), lane="control")


def _models(device: dict, aux: dict) -> dict:
    """The device-side network and the auxiliary network as one model (their tensors prefixed "d." and "a.")."""
    return {**{"d." + k: v for k, v in device.items()}, **{"a." + k: v for k, v in aux.items()}}


def _split_models(arrays: dict) -> tuple[dict, dict]:
    return ({k[2:]: v for k, v in arrays.items() if k.startswith("d.")},
            {k[2:]: v for k, v in arrays.items() if k.startswith("a.")})


def _typed(mb: Messenger, peer: Peer, parts: list, family: MessageFamily, timeout_s: float) -> tuple[Any, dict]:
    """The typed message of `family` in `parts` from `peer` and its arrays (a model's tensors, read in pieces when
    they do not come inline); ProtocolError naming the peer and the problem."""
    head, arrays = mb.receive_arrays(peer, parts, timeout_s)
    try:
        return decode(head, family), arrays
    except ProtocolError as exc:
        raise ProtocolError(f"from {peer}: {exc}", exc.type, exc.head) from None


def _decoded(who: Any, head: dict | None, refused: RefusalSink | None = None) -> Any:
    """The server's view of a device's header (None for a receive error, or a malformed header: logged, and passed
    to `refused`)."""
    if head is None:
        return None
    try:
        return decode(head, TO_SERVER)
    except ProtocolError as exc:
        # (counted by the type when it is one of the family's: a bounded set, a peer cannot mint new keys)
        kind = exc.type if exc.type in TO_SERVER.types else ""
        if _report(refused, who, exc, "message", f"a well-formed message of {TO_SERVER.name}", kind):
            log.warning("fedoptima server: message %r from %s refused: %s", str(head.get("type"))[:32], who, exc)
        return None


def _on_activations(sched: TaskScheduler, byes: dict, who: Any, msg: Activations, arrays: dict,
                    expect: _Expect | None) -> None:
    if expect is not None and (why := expect.activations_refusal(arrays)) is not None:
        sched.grants.pop(who, None)  # the refused batch used its slot of omega: freed now, not at grant_timeout_s
        raise ValueError(why)
    sched.put(ActivationBatch(who, (arrays["h"], arrays["y"].astype(np.int64)), int(arrays["h"].nbytes)))


def _on_model(sched: TaskScheduler, byes: dict, who: Any, msg: DeviceModel, arrays: dict,
              expect: _Expect | None) -> None:
    """A device's models into the model queue: one waiting per device (a device sends its next only after the
    global model), from a version the server issued, shaped like the global models."""
    if any(m.origin == who for m in sched.model_queue):
        raise ValueError(f"version={msg.version}, expected no model while its previous one waits (one per "
                         "global model received)")
    models = _split_models(arrays)
    if expect is not None:
        if msg.version > expect.agg.version:
            raise ValueError(f"version={msg.version}, expected <= {expect.agg.version} (the latest issued)")
        for part, like in zip(models, (expect.agg.device, expect.agg.aux)):
            check_model_update(part, 1, f"{who}", like=like)
    sched.put(ModelUpdate(who, models, msg.version))


def _on_bye(sched: TaskScheduler, byes: dict, who: Any, msg: DeviceBye, arrays: dict, expect: _Expect | None) -> None:
    if who not in sched.queues:
        raise ValueError(f"sender={who}, expected a device that joined ({list(sched.queues)[:8]})")
    byes[who] = msg


# what the server does with each device message during training (a HELLO again is ignored)
_HANDLERS: dict[type, Callable[[TaskScheduler, dict, Any, Any, dict, Any], None]] = {
    Activations: _on_activations, DeviceModel: _on_model, DeviceBye: _on_bye}


def _on_message(sched: TaskScheduler, res: ServerResult, byes: dict, who: Any, head: dict | None, arrays: Any,
                expect: _Expect | None = None, refused: RefusalSink | None = None) -> None:
    """A received message into the scheduler (activations, models) or `byes`, checked against `expect` when given;
    a refusal is logged and passed to `refused`, never raised: the server goes on serving every device."""
    if head is None:
        log.warning("fedoptima server: from %s: %s", who, arrays)
        return
    msg = _decoded(who, head, refused)
    handler = _HANDLERS.get(type(msg))
    if handler is None:
        return
    try:
        handler(sched, byes, who, msg, arrays, expect)
    except (SchedulerError, KeyError, ValueError, TypeError) as exc:
        if _report(refused, who, exc, msg.TYPE, message=msg.TYPE):
            log.warning("fedoptima server: message %r from %s refused: %s", msg.TYPE, who, exc)


def run_device(ep: Endpoint, server: tuple[str, int], index: int, num_devices: int, task: Task,
               spec: FedOptimaSpec, info: DeviceInfo, max_local_rounds: int = 1_000_000,
               refused: RefusalSink | None = None) -> dict:
    """Algorithm 1 on one device until STOP (or `max_local_rounds`); its measured idle and busy seconds. Each
    refusal of the server's messages is logged and passed to `refused`."""
    import paddle

    link = _DeviceLink(Messenger(ep, TO_DEVICE, channel=CHANNEL), Peer(*server), spec, refused)
    init, arrays = link.join(server, info)
    layers = task.layers()
    try:
        dev_net, _ = split_model(layers, check_split(init.split, len(layers)))
    except ValueError as exc:
        raise FedOptimaError(f"the server's INIT split={init.split} does not fit this model: {exc}") from None
    aux = default_auxiliary(list(dev_net), paddle.to_tensor(task.sample()), task.num_classes)
    trainer = DeviceTrainer(dev_net, aux, lr=spec.lr_device)
    why = _global_refusal(arrays, trainer)
    if why is not None:
        raise FedOptimaError(f"the server's INIT models do not fit this model: {why}; run the same task on the "
                             "server and every device")
    trainer.load(*_split_models(arrays))
    version = init.version
    slow = spec.slowdown_of(index)
    data = task.batches(index, num_devices)
    stats = {"idle_s": 0.0, "busy_s": 0.0, "iterations": 0, "sent_batches": 0, "rounds": 0}
    t0 = time.monotonic()
    for _ in range(max_local_rounds):
        _local_iterations(link, trainer, data, slow, spec.local_iterations, stats)
        if link.stopped:
            break
        version = _exchange_models(link, trainer, version, stats)
        if link.stopped:
            break
    stats["wall_s"] = time.monotonic() - t0
    stats["idle_s"] = max(0.0, stats["wall_s"] - stats["busy_s"])  # every second not spent training
    link.ch.send(pack_message(DeviceBye(stats=stats)), lane="control")
    ep.flush(timeout_s=10)
    return stats


class _DeviceLink:
    """A device's channel to the server: the typed messages it receives and the Sender Status they set (on after
    a GRANT, `stopped` after STOP)."""

    def __init__(self, mb: Messenger, peer: Peer, spec: FedOptimaSpec, refused: RefusalSink | None = None) -> None:
        self.mb, self.peer, self.spec, self.ch = mb, peer, spec, mb.channel(peer)
        self.refused = refused
        self.granted = self.stopped = False

    def join(self, server: tuple[str, int], info: DeviceInfo) -> tuple[Init, dict]:
        """HELLO with the device's information; the server's INIT and the global models that come with it."""
        spec = self.spec
        self.ch.send(pack_message(DeviceHello(flops_per_s=info.flops_per_s,
                                              bandwidth_bytes_per_s=info.bandwidth_bytes_per_s)), lane="control")
        deadline = time.monotonic() + spec.join_timeout_s * 2
        while True:  # (in half-second waits: SIGTERM is polled meanwhile)
            check_terminated()
            try:
                parts = self.ch.recv_parts(timeout_s=max(0.01, min(0.5, deadline - time.monotonic())))
                break
            except TimeoutError:
                if time.monotonic() >= deadline:
                    raise FedOptimaError(f"the server sent no INIT within {spec.join_timeout_s * 2} s; is it "
                                         f"running as {server[0]}/{server[1]} of this job?") from None
        init, arrays = _typed(self.mb, self.peer, parts, TO_DEVICE, spec.join_timeout_s)
        if not isinstance(init, Init):
            raise FedOptimaError(f"expected INIT from the server, got {init.TYPE!r}")
        return init, arrays

    def poll(self, timeout_s: float) -> tuple[Any, dict] | None:
        """The next message within `timeout_s` (None: none, or one refused and logged); a GRANT or STOP noted."""
        check_terminated()
        try:
            m, a = _typed(self.mb, self.peer, self.ch.recv_parts(timeout_s=timeout_s), TO_DEVICE,
                          self.spec.global_timeout_s)
        except TimeoutError:
            return None
        except ProtocolError as exc:
            kind = exc.type if exc.type in TO_DEVICE.types else ""
            if _report(self.refused, self.peer, exc, "message", f"a well-formed message of {TO_DEVICE.name}", kind):
                log.warning("fedoptima device: %s; ignored", exc)
            return None
        if isinstance(m, SendSlot):
            self.granted = True
        elif isinstance(m, Stop):
            self.stopped = True
        return m, a

    def drain(self) -> None:
        """Take every message already here (the Sender Status as of now)."""
        while self.poll(0.0) is not None:
            pass


def _local_iterations(link: _DeviceLink, trainer: DeviceTrainer, data: Iterator, slow: float, n: int,
                      stats: dict) -> None:
    """Algorithm 1's H iterations (fewer on STOP): train on the local loss, send the activations when granted."""
    for _ in range(n):
        link.drain()
        if link.stopped:
            return
        x, y = next(data)
        b0 = time.monotonic()
        h, _loss = trainer.step(x, y)
        took = time.monotonic() - b0
        if slow > 1:
            time.sleep((slow - 1) * took)  # a slower device: the same work takes `slow` times as long
        stats["busy_s"] += time.monotonic() - b0
        stats["iterations"] += 1
        link.drain()  # the Sender Status after the iteration: a grant may have come in
        if link.granted and not link.stopped:  # the Sender is on: send, then switch it off until the next grant
            link.ch.send(pack_message(Activations(), {"h": h, "y": np.asarray(y, np.int64)}), lane="activation")
            link.granted = False
            stats["sent_batches"] += 1


def _global_refusal(arrays: dict, trainer: DeviceTrainer) -> str | None:
    """Why global models from the server do not fit the device's (keys, shapes, dtypes, finite); None when they do."""
    try:
        for part, like in zip(_split_models(arrays), trainer.models()):
            check_model_update(part, 1, "server", like=like)
    except ValueError as exc:
        return str(exc)
    return None


def _exchange_models(link: _DeviceLink, trainer: DeviceTrainer, version: int, stats: dict) -> int:
    """The device's models to the server, then its global models within `global_timeout_s` (else the device
    trains on with its own); the version the next models are trained from."""
    timeout_s = link.spec.global_timeout_s
    dstate, astate = trainer.models()
    link.mb.send_model(link.peer, DeviceModel(version=version), _models(dstate, astate), lane="bulk", inline=True)
    got, w0 = None, time.monotonic()
    while not link.stopped and time.monotonic() - w0 < timeout_s:
        r = link.poll(min(0.5, timeout_s))
        if r is not None and isinstance(r[0], AggregatedModel):
            got = r
            break
    stats["wait_global_s"] = stats.get("wait_global_s", 0.0) + time.monotonic() - w0
    if got is None:
        return version
    if got[0].version < version:
        why = f"version={got[0].version}, expected >= {version} (the version it trained from)"
    elif (why := _global_refusal(got[1], trainer)) is None:
        trainer.load(*_split_models(got[1]))
        stats["rounds"] += 1
        return got[0].version
    if _report(link.refused, link.peer, why, "model", "the device's models' tensors", "global"):
        log.warning("fedoptima device: global from the server refused: %s; training on with its own", why)
    return version
