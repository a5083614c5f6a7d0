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
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Protocol

import numpy as np

from nebula.channel import ChannelError, Endpoint
from nebula.federated.fedoptima.auxiliary import default_auxiliary
from nebula.federated.fedoptima.config import FedOptimaSpec
from nebula.federated.fedoptima.engine import (AsyncAggregator, DeviceTrainer, ServerTrainer, load_state, split_model,
                                              state_of)
from nebula.federated.fedoptima.messages import (TO_DEVICE, TO_SERVER, Activations, AggregatedModel, DeviceBye,
                                                DeviceHello, DeviceModel, Init, SendSlot, Stop)
from nebula.federated.fedoptima.scheduler import ActivationBatch, ModelUpdate, SchedulerError, TaskScheduler
from nebula.federated.fedoptima.split import DeviceInfo, profile_layers, split_point
from nebula.messaging import Messenger, MessageFamily, Peer, ProtocolError, decode, pack_message

__all__ = ["Task", "FedOptimaError", "ServerResult", "serve", "run_device", "CHANNEL"]

log = logging.getLogger(__name__)
CHANNEL = "fedoptima"


class FedOptimaError(RuntimeError):
    """The run cannot go on (no device joined, the server never answered)."""


class Task(Protocol):
    """What a FedOptima run trains: a sequential model, local data per device, held-out data."""

    num_classes: int

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


def _accuracy(parts: list, x: np.ndarray, y: np.ndarray) -> float:
    import paddle

    with paddle.no_grad():
        h = paddle.to_tensor(x)
        for p in parts:
            h = p(h)
    return float((h.numpy().argmax(-1) == y).mean())


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
          should_stop: Callable[[], bool] | None = None) -> ServerResult:
    """Run the server side until E rounds, `duration_s`, silence or `should_stop()`; the measured result."""
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
        return _serve(res, mb, chans, inbox, task, spec, paddle, should_stop or (lambda: False))
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=2)


def _serve(res: ServerResult, mb: Messenger, chans: dict, inbox: queue.Queue, task: Task, spec: FedOptimaSpec,
           paddle, should_stop: Callable[[], bool]) -> ServerResult:
    # ---- initialisation: device information, split point, auxiliary network ----
    infos: dict = {}
    deadline = time.monotonic() + spec.join_timeout_s
    while len(infos) < len(chans) and time.monotonic() < deadline:
        try:
            who, head, _ = inbox.get(timeout=max(0.01, deadline - time.monotonic()))
        except queue.Empty:
            break
        hello = _decoded(who, head)
        if isinstance(hello, DeviceHello):
            infos[who] = DeviceInfo(flops_per_s=hello.flops_per_s, bandwidth_bytes_per_s=hello.bandwidth_bytes_per_s)
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
    for d in active:
        mb.send_model(Peer(*d), Init(split=res.split, version=0), _models(agg.device, agg.aux), lane="bulk",
                      inline=True)

    x_test, y_test = task.test_data()
    res.initial_accuracy = _accuracy([dev_net, srv_net], x_test, y_test)

    # ---- training: Algorithm 4 fed by the Task Scheduler ----
    t0 = time.monotonic()
    last_heard = t0
    byes: dict = {}
    silent: set = set()  # devices whose grant expired unanswered
    while True:
        while True:  # the Receiver's queue into the scheduler (Algorithm 2)
            try:
                who, head, arrays = inbox.get_nowait()
            except queue.Empty:
                break
            last_heard = time.monotonic()
            silent.discard(who)  # heard from again: it may be granted again
            _on_message(sched, res, byes, who, head, arrays)
        while sched.expired:  # a grant went unanswered: no more grants until the device is heard from
            silent.add(sched.expired.pop())
        _send_grants(sched, chans, [d for d in active if d not in silent])
        now = time.monotonic()
        if res.rounds >= spec.max_rounds:
            res.ended = f"{spec.max_rounds} rounds"
            break
        if now - t0 >= spec.duration_s:
            res.ended = f"duration_s={spec.duration_s}"
            break
        if should_stop():
            res.ended = "stop asked"
            break
        m = sched.get()
        if m is None:
            if now - last_heard > spec.idle_timeout_s:
                res.ended = f"no device sent anything for idle_timeout_s={spec.idle_timeout_s}"
                log.warning("fedoptima server: %s; ending the run", res.ended)
                break
            w0 = time.monotonic()
            try:
                who, head, arrays = inbox.get(timeout=0.05)
            except queue.Empty:
                pass
            else:
                last_heard = time.monotonic()
                silent.discard(who)
                _on_message(sched, res, byes, who, head, arrays)
            res.idle_s += time.monotonic() - w0
            continue
        if isinstance(m, ActivationBatch):  # the dequeue freed a slot: its turn-on goes out before this step
            _send_grants(sched, chans, [d for d in active if d not in silent])
        b0 = time.monotonic()
        if isinstance(m, ActivationBatch):
            h, y = m.content
            trainer.step(h, y)
            res.server_batches += 1
            res.samples += len(y)
        else:
            dstate, astate = m.content
            try:
                res.aggregations += int(agg.apply(dstate, astate, m.version, who=str(m.origin)))
            except ValueError as exc:
                log.warning("fedoptima server: model from %s rejected: %s", m.origin, exc)
            mb.send_model(Peer(*m.origin), AggregatedModel(version=agg.version), _models(agg.device, agg.aux),
                          lane="bulk", inline=True)
            res.rounds = res.aggregations // len(active)  # a round is K aggregations (Algorithm 4, line 21)
        res.busy_s += time.monotonic() - b0
    res.wall_s = time.monotonic() - t0
    res.skipped, res.peak_held = agg.skipped, sched.peak_held
    res.used = {f"{c}/{r}": n for (c, r), n in sched.counters.items()}
    for d in active:
        chans[d].send(pack_message(Stop()), lane="control")
    deadline = time.monotonic() + spec.join_timeout_s
    while len(byes) < len(active) and time.monotonic() < deadline:
        try:
            who, head, arrays = inbox.get(timeout=max(0.01, deadline - time.monotonic()))
        except queue.Empty:
            break
        bye = _decoded(who, head)
        if isinstance(bye, DeviceBye):
            byes[who] = bye.stats
    res.devices = {f"{c}/{r}": stats for (c, r), stats in byes.items()}
    res.missing += [f"{c}/{r}" for (c, r) in active if (c, r) not in byes]
    load_state(dev_net, agg.device)
    res.accuracy = _accuracy([dev_net, srv_net], x_test, y_test)
    return res


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


def _decoded(who: Any, head: dict | None) -> Any:
    """The server's view of a device's header (None for a receive error, logged with the message)."""
    if head is None:
        return None
    try:
        return decode(head, TO_SERVER)
    except ProtocolError as exc:
        log.warning("fedoptima server: message %r from %s refused: %s", str(head.get("type"))[:32], who, exc)
        return None


def _on_message(sched: TaskScheduler, res: ServerResult, byes: dict, who, head, arrays) -> None:
    if head is None:
        log.warning("fedoptima server: from %s: %s", who, arrays)
        return
    msg = _decoded(who, head)
    try:
        if isinstance(msg, Activations):
            sched.put(ActivationBatch(who, (arrays["h"], arrays["y"].astype(np.int64)), int(arrays["h"].nbytes)))
        elif isinstance(msg, DeviceModel):
            sched.put(ModelUpdate(who, _split_models(arrays), msg.version))
        elif isinstance(msg, DeviceBye):
            byes[who] = msg.stats
    except (SchedulerError, KeyError, ValueError, TypeError) as exc:
        log.warning("fedoptima server: message %r from %s refused: %s", msg.TYPE, who, exc)


def run_device(ep: Endpoint, server: tuple[str, int], index: int, num_devices: int, task: Task,
               spec: FedOptimaSpec, info: DeviceInfo, max_local_rounds: int = 1_000_000) -> dict:
    """Algorithm 1 on one device until STOP (or `max_local_rounds`); its measured idle and busy seconds."""
    import paddle

    mb, peer = Messenger(ep, TO_DEVICE, channel=CHANNEL), Peer(*server)
    ch = mb.channel(peer)
    ch.send(pack_message(DeviceHello(flops_per_s=info.flops_per_s, bandwidth_bytes_per_s=info.bandwidth_bytes_per_s)),
            lane="control")
    try:
        init, arrays = _typed(mb, peer, ch.recv_parts(timeout_s=spec.join_timeout_s * 2), TO_DEVICE,
                              spec.join_timeout_s)
    except TimeoutError:
        raise FedOptimaError(f"the server sent no INIT within {spec.join_timeout_s * 2} s; is it running "
                             f"as {server[0]}/{server[1]} of this job?") from None
    if not isinstance(init, Init):
        raise FedOptimaError(f"expected INIT from the server, got {init.TYPE!r}")
    layers = task.layers()
    dev_net, _ = split_model(layers, init.split)
    aux = default_auxiliary(list(dev_net), paddle.to_tensor(task.sample()), task.num_classes)
    trainer = DeviceTrainer(dev_net, aux, lr=spec.lr_device)
    trainer.load(*_split_models(arrays))
    version = init.version
    slow = spec.slowdown_of(index)
    data = task.batches(index, num_devices)
    stats = {"idle_s": 0.0, "busy_s": 0.0, "iterations": 0, "sent_batches": 0, "rounds": 0}
    granted, stopped = False, False
    t0 = time.monotonic()

    def poll(timeout_s: float) -> tuple[Any, dict] | None:
        nonlocal granted, stopped
        try:
            m, a = _typed(mb, peer, ch.recv_parts(timeout_s=timeout_s), TO_DEVICE, spec.global_timeout_s)
        except TimeoutError:
            return None
        except ProtocolError as exc:
            log.warning("fedoptima device: %s; ignored", exc)
            return None
        if isinstance(m, SendSlot):
            granted = True
        elif isinstance(m, Stop):
            stopped = True
        return m, a

    for _ in range(max_local_rounds):
        for _ in range(spec.local_iterations):
            while poll(0.0) is not None:
                pass
            if stopped:
                break
            x, y = next(data)
            b0 = time.monotonic()
            h, _loss = trainer.step(x, y)
            took = time.monotonic() - b0
            if slow > 1:
                time.sleep((slow - 1) * took)  # a slower device: the same work takes `slow` times as long
            stats["busy_s"] += time.monotonic() - b0
            stats["iterations"] += 1
            while poll(0.0) is not None:  # the Sender Status after the iteration: a grant may have come in
                pass
            if granted and not stopped:  # the Sender is on: send, then switch it off until the next grant
                ch.send(pack_message(Activations(), {"h": h, "y": np.asarray(y, np.int64)}), lane="activation")
                granted = False
                stats["sent_batches"] += 1
        if stopped:
            break
        dstate, astate = trainer.models()
        mb.send_model(peer, DeviceModel(version=version), _models(dstate, astate), lane="bulk", inline=True)
        got, w0 = None, time.monotonic()
        while not stopped and time.monotonic() - w0 < spec.global_timeout_s:
            r = poll(min(0.5, spec.global_timeout_s))
            if r is not None and isinstance(r[0], AggregatedModel):
                got = r
                break
        stats["wait_global_s"] = stats.get("wait_global_s", 0.0) + time.monotonic() - w0
        if got is not None:
            trainer.load(*_split_models(got[1]))
            version = got[0].version
            stats["rounds"] += 1
        if stopped:
            break
    stats["wall_s"] = time.monotonic() - t0
    stats["idle_s"] = max(0.0, stats["wall_s"] - stats["busy_s"])  # every second not spent training
    ch.send(pack_message(DeviceBye(stats=stats)), lane="control")
    ep.flush(timeout_s=10)
    return stats
