"""OWL over Nebula channels: the server sends each model group once (to the central worker of its communication
group) and workers pass groups to each other over the cluster-local path, each starting the forward pass of a
segment as soon as it arrives; after local steps, updates go back and the server averages them (FedAvg).

Channel `owl` between every pair of actors. Server -> worker: PLAN (control) once, GROUP {round, group} + that
group's tensors (bulk), STOP. Worker -> worker: GROUP, as the deploy setting says. Worker -> server: UPDATE
{round, num_examples} + its model (bulk); PULL {round, groups} when a peer has not forwarded a group within
`peer_timeout_s` (the fallback: the server sends it itself). The server leaves out updates later than
`round_timeout_s`; a round with none is an error. An update's `num_examples` is bounded by what the server knows:
`local_steps` x the task's `batch` for each worker it stands for. Every wait polls `check_terminated` (SIGTERM).
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator, Protocol

import numpy as np

from nebula.channel import ChannelError, Endpoint
from nebula.federated._actor import RefusalSink, check_terminated
from nebula.federated.aggregate import fedavg
from nebula.federated.owl.config import OwlSpec
from nebula.federated.owl.deploy import DeploySetting, deploy_setting_for
from nebula.federated.owl.messages import TO_SERVER, TO_WORKER, DeployPlan, GroupPull, ModelGroup, OwlUpdate, Stop
from nebula.federated.owl.model import OverlappedForward, model_branches
from nebula.mean import check_model_update
from nebula.messaging import Messenger, MessageFamily, Peer, ProtocolError, decode, pack_message, unpack_message

__all__ = ["OwlTask", "OwlError", "OwlResult", "serve_owl", "run_owl_worker", "CHANNEL"]

log = logging.getLogger(__name__)
CHANNEL = "owl"
# what an actor's caller does with each refusal besides its log line: refused(peer, field, value, expected), e.g.
# an audit record (nebula.federated.actors); the runtime itself writes no file


class OwlError(RuntimeError):
    """The run cannot go on (no update in a round, the server silent)."""


class OwlTask(Protocol):
    """What an OWL run trains: an nn.Sequential with Parallel blocks, local data per worker (batches of at most
    `batch` examples), held-out data."""

    batch: int

    def model(self): ...

    def batches(self, worker: int, num_workers: int) -> Iterator[tuple[np.ndarray, np.ndarray]]: ...

    def test_data(self) -> tuple[np.ndarray, np.ndarray]: ...


@dataclass
class OwlResult:
    """What the server measured, per round and overall."""

    distribution: str = "owl"
    num_groups: int = 0
    group_bytes: list = field(default_factory=list)
    round_s: list = field(default_factory=list)
    server_egress_bytes: list = field(default_factory=list)
    updates: list = field(default_factory=list)  # worker updates in each round's model
    wan_updates: list = field(default_factory=list)  # update messages that reached the server each round
    pulls_served: int = 0
    accuracy: float = 0.0
    initial_accuracy: float = 0.0


def _accuracy(model, x: np.ndarray, y: np.ndarray) -> float:  # noqa: ANN001
    import paddle

    with paddle.no_grad():
        return float((model(paddle.to_tensor(x)).numpy().argmax(-1) == y).mean())


def _receive(mb: Messenger, peer: Peer, who, inbox: queue.Queue, stop: threading.Event,  # noqa: ANN001
             piece_timeout_s: float) -> None:
    ch = mb.channel(peer)
    while not stop.is_set():
        try:
            parts = ch.recv_parts(timeout_s=0.5)
        except TimeoutError:
            continue
        except ChannelError as exc:
            inbox.put((who, None, exc))
            if stop.wait(1.0):
                return
            continue
        try:  # (decoded where it is handled: the family is the role's)
            inbox.put((who, *mb.receive_arrays(peer, parts, piece_timeout_s)))
        except (ProtocolError, TimeoutError) as exc:
            inbox.put((who, None, exc))


def _refuse(role: str, who, msg, field: str, value, expected: str,  # noqa: ANN001
            refused: RefusalSink | None = None) -> None:
    """`refused` (the actor's audit, counted), then the one line a refused message gets unless `refused` says it is
    a repeat within its interval: who sent it, the field, its value and what the receiver expected. The message is
    dropped, every other peer served as before."""
    name = "/".join(map(str, who)) if isinstance(who, tuple) else str(who)
    if refused is None or refused(name, field, value, expected, message=msg.TYPE) is not False:
        log.warning("%s: %s from %s refused: %s=%s, expected %s", role, msg.TYPE, name, field, str(value)[:160],
                    expected)


def _get(inbox: queue.Queue, timeout_s: float):  # noqa: ANN202
    """The next item of `inbox` within `timeout_s` (queue.Empty if none), polling `check_terminated` (SIGTERM)
    at least every half second meanwhile."""
    deadline = time.monotonic() + timeout_s
    while True:
        check_terminated()
        try:
            return inbox.get(timeout=max(0.0, min(0.5, deadline - time.monotonic())))
        except queue.Empty:
            if time.monotonic() >= deadline:
                raise


def _batch_of(task: OwlTask, num_workers: int) -> int:
    """The most examples one of a worker's batches holds: the task's `batch`, or (a task that does not say) the
    size of the first batch its data gives worker 0."""
    batch = getattr(task, "batch", None)
    if isinstance(batch, int) and not isinstance(batch, bool) and batch > 0:
        return batch
    return len(next(iter(task.batches(0, num_workers)))[1])


def _model_refusal(arrays, like: dict, who, num_examples: int = 1) -> str | None:  # noqa: ANN001
    """Why received tensors are not the ones `like` holds (keys, shapes, dtypes, finite values); None when they are."""
    try:
        check_model_update(arrays, num_examples, str(who), like=like)
    except ValueError as exc:
        return str(exc)
    return None


def _decoded(who, head: dict | None, arrays, family, role: str, quiet: bool = False,  # noqa: ANN001,ANN202
             refused: RefusalSink | None = None):
    """The typed message of a received header (None: a receive error, logged, or a malformed header, logged and
    passed to `refused` unless `quiet`)."""
    if head is None:
        if not quiet:
            log.warning("%s: from %s: %s", role, who, arrays)
        return None
    try:
        return decode(head, family)
    except ProtocolError as exc:
        if quiet:
            return None
        name = "/".join(map(str, who)) if isinstance(who, tuple) else str(who)
        # counted by the type when it is one of the family's (a bounded set: a peer cannot mint new keys)
        kind = exc.type if exc.type in family.types else ""
        if refused is None or refused(name, "message", exc, f"a well-formed message of {family.name}",
                                      message=kind) is not False:
            log.warning("%s: message from %s refused: %s", role, who, exc)
        return None


@contextmanager
def _receivers(mb: Messenger, peers: dict, inbox: queue.Queue, piece_timeout_s: float) -> Iterator[None]:
    """One thread per peer putting what it receives into `inbox` while the block runs; stopped and joined after."""
    stop = threading.Event()
    ts = [threading.Thread(target=_receive, args=(mb, peer, who, inbox, stop, piece_timeout_s), daemon=True)
          for who, peer in peers.items()]
    for t in ts:
        t.start()
    try:
        yield
    finally:
        stop.set()
        for t in ts:
            t.join(timeout=2)


def _send_model(mb: Messenger, peer: Peer, msg, weights: dict) -> int:  # noqa: ANN001
    """Send `msg` with `weights` as a model (inline when small, else in pieces); the bytes that left."""
    before = sum(mb.sent_bytes.values())
    mb.send_model(peer, msg, weights, lane="bulk", inline=True)
    return sum(mb.sent_bytes.values()) - before


def _messenger(ep: Endpoint, inbox: MessageFamily) -> Messenger:
    return Messenger(ep, inbox, channel=CHANNEL)


# ---- the server ----
def serve_owl(ep: Endpoint, workers: list[tuple[str, int]], task: OwlTask, spec: OwlSpec,
              should_stop: Callable[[], bool] | None = None, refused: RefusalSink | None = None) -> OwlResult:
    """Run `spec.rounds` rounds of federated training with OWL (or server-only) distribution, fewer when
    `should_stop()` turns true between rounds; what was measured. Each refusal is logged and passed to `refused`."""
    import paddle

    model = task.model()
    branches, key_branch = model_branches(model)
    sizes = [b.nbytes for b in branches]
    setting = deploy_setting_for(sizes, [c for c, _ in workers], spec)
    group_of = {b: g for g, members in enumerate(setting.groups) for b in members}
    group_keys = [[k for k, b in key_branch.items() if group_of[b] == g] for g in range(len(setting.groups))]
    res = OwlResult(distribution=spec.distribution, num_groups=len(setting.groups),
                    group_bytes=[sum(sizes[b] for b in g) for g in setting.groups])
    x_test, y_test = task.test_data()
    res.initial_accuracy = _accuracy(model, x_test, y_test)
    server = _OwlServer(_messenger(ep, TO_SERVER), workers, setting, group_keys, spec, res, refused,
                        max_examples=spec.local_steps * _batch_of(task, len(workers)))
    with _receivers(server.mb, server.addr, server.inbox, spec.round_timeout_s):
        plan = _deploy_plan(workers, setting, spec)
        for ch in server.chans.values():
            ch.send(pack_message(plan), lane="control")
        weights = {k: v.numpy().copy() for k, v in model.state_dict().items()}
        for rnd in range(spec.rounds):
            check_terminated()
            if rnd and should_stop is not None and should_stop():
                break
            weights = server.round(rnd, weights)
        for ch in server.chans.values():
            ch.send(pack_message(Stop()), lane="control")
        model.set_state_dict({k: paddle.to_tensor(v) for k, v in weights.items()})
        res.accuracy = _accuracy(model, x_test, y_test)
        ep.flush(timeout_s=10)
        return res


def _deploy_plan(workers: list[tuple[str, int]], setting: DeploySetting, spec: OwlSpec) -> DeployPlan:
    """The deploy setting as the workers receive it, once, before the first round."""
    return DeployPlan(workers=tuple(f"{c}/{r}" for c, r in workers), combine=spec.combine,
                      groups=tuple(tuple(g) for g in setting.groups),
                      pulls=tuple(tuple((p.group, p.source) for p in ps) for ps in setting.pulls), rounds=spec.rounds)


class _OwlServer:
    """The server's rounds: groups out as the deploy setting says (and on a PULL), updates in, their FedAvg."""

    def __init__(self, mb: Messenger, workers: list[tuple[str, int]], setting: DeploySetting, group_keys: list,
                 spec: OwlSpec, res: OwlResult, refused: RefusalSink | None = None, *, max_examples: int) -> None:
        self.mb, self.workers, self.setting, self.spec, self.res = mb, workers, setting, spec, res
        self.refused = refused
        self.max_examples = max_examples  # one worker's examples in a round: local_steps x the task's batch
        self.group_keys = group_keys  # the state-dict keys of each group's tensors
        self.addr = {w: Peer(*w) for w in workers}
        self.chans = {w: mb.channel(p) for w, p in self.addr.items()}
        self.inbox: queue.Queue = queue.Queue()
        # with combine=cluster the first worker of each cluster averages its cluster's updates (FEDn's combiner)
        # and one update per cluster crosses the WAN; with combine=server every worker sends its own
        combiners = {c: (c, r) for c, r in reversed(workers)}
        self.senders = set(combiners.values()) if spec.combine == "cluster" else set(workers)
        # the worker updates each sender's update may stand for: its cluster's workers, or itself alone
        self.stands_for = {w: sum(c == w[0] for c, _ in workers) if spec.combine == "cluster" else 1
                           for w in self.senders}

    def round(self, rnd: int, weights: dict) -> dict:
        """Round `rnd` from `weights`: the averaged model (OwlError when no update came in time)."""
        spec, res, workers = self.spec, self.res, self.workers
        t0 = time.monotonic()
        egress = 0
        for g, wi in sorted(self.setting.from_server(), key=lambda gw: (gw[1], gw[0])):
            egress += self._send_group(rnd, weights, g, workers[wi])
        updates, counts, pulled = self._collect(rnd, weights, t0 + spec.round_timeout_s)
        egress += pulled
        if not updates:
            raise OwlError(f"round {rnd}: no worker sent an update within round_timeout_s={spec.round_timeout_s}")
        if sum(counts.values()) < len(workers):
            log.warning("owl server: round %d goes on with %d of %d updates", rnd, sum(counts.values()),
                        len(workers))
        try:
            weights = fedavg([updates[w] for w in sorted(updates)], [str(w) for w in sorted(updates)])
        except ValueError as exc:
            raise OwlError(f"round {rnd}: {exc}") from None
        res.round_s.append(time.monotonic() - t0)
        res.server_egress_bytes.append(egress)
        res.updates.append(sum(counts.values()))
        res.wan_updates.append(len(updates))
        return weights

    def _send_group(self, rnd: int, weights: dict, g: int, w: tuple[str, int]) -> int:
        return _send_model(self.mb, self.addr[w], ModelGroup(round=rnd, group=g),
                           {k: weights[k] for k in self.group_keys[g]})

    def _collect(self, rnd: int, weights: dict, deadline: float) -> tuple[dict, dict, int]:
        """The round's updates until every sender's is in or `deadline`, serving PULLs meanwhile: the updates
        (sender -> (model, examples)), the worker updates each stands for, the bytes the pulls sent."""
        updates: dict = {}
        counts: dict = {}
        pulled: dict = {}  # worker -> the groups it pulled this round
        egress = 0
        while len(updates) < len(self.senders) and time.monotonic() < deadline:
            try:
                who, head, arrays = _get(self.inbox, max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                break
            msg = _decoded(who, head, arrays, TO_SERVER, "owl server", refused=self.refused)
            if isinstance(msg, OwlUpdate) and self._update_ok(who, msg, arrays, rnd, weights, updates):
                updates[who] = (arrays, msg.num_examples)
                counts[who] = msg.num_updates
            elif isinstance(msg, GroupPull) and self._pull_ok(who, msg, rnd):
                served = pulled.setdefault(who, set())  # a group is served once per worker and round: a repeated
                for g in sorted(set(msg.groups) - served):  # PULL (the first still on its way) sends only the rest
                    served.add(g)
                    egress += self._send_group(rnd, weights, g, who)
                    self.res.pulls_served += 1
        return updates, counts, egress

    def _update_ok(self, who, msg: OwlUpdate, arrays, rnd: int, weights: dict, updates: dict) -> bool:  # noqa: ANN001
        """Whether an update is this round's, from a worker that sends updates, standing for no more workers than
        its cluster has, once, and shaped like the model; a refusal logged, a late one (an earlier round) dropped."""
        if msg.round < rnd:
            return False
        if msg.round > rnd:
            self._no(who, msg, "round", msg.round, f"{rnd} (the round in progress)")
        elif who not in self.senders:
            self._no(who, msg, "sender", "/".join(map(str, who)),
                    "its cluster's combiner (combine=cluster: the first worker of each cluster sends the update)")
        elif not 1 <= msg.num_updates <= self.stands_for[who]:
            self._no(who, msg, "num_updates", msg.num_updates,
                    f"1..{self.stands_for[who]} (the workers it combines)")
        elif who in updates:
            self._no(who, msg, "round", msg.round, "one update per sender and round")
        elif msg.num_examples > (most := msg.num_updates * self.max_examples):
            self._no(who, msg, "num_examples", msg.num_examples,
                     f"1..{most} (local_steps x the task's batch for each of its {msg.num_updates} updates)")
        elif (why := _model_refusal(arrays, weights, f"{who[0]}/{who[1]}", msg.num_examples)) is not None:
            self._no(who, msg, "model", why, "the global model's tensors")
        else:
            return True
        return False

    def _no(self, who, msg, field: str, value, expected: str) -> None:  # noqa: ANN001
        _refuse("owl server", who, msg, field, value, expected, self.refused)

    def _pull_ok(self, who, msg: GroupPull, rnd: int) -> bool:  # noqa: ANN001
        """Whether a PULL is this round's and names groups that exist."""
        d = len(self.setting.groups)
        if msg.round != rnd:
            if msg.round > rnd:
                self._no(who, msg, "round", msg.round, f"{rnd} (the round in progress)")
            return False
        bad = next((g for g in msg.groups if not 0 <= g < d), None)
        if bad is not None:
            self._no(who, msg, "groups", bad, f"a group index in 0..{d - 1}")
        else:
            return True
        return False


# ---- a worker ----
def run_owl_worker(ep: Endpoint, server: tuple[str, int], task: OwlTask, spec: OwlSpec,
                   refused: RefusalSink | None = None) -> dict:
    """One worker: receive groups (from the server or peers), forward them on, train overlapped, send updates; each
    refusal logged and passed to `refused`."""
    mb = _messenger(ep, TO_WORKER)
    srv = mb.channel(Peer(*server))
    deadline = time.monotonic() + spec.round_timeout_s
    while True:  # (in half-second waits: SIGTERM is polled meanwhile)
        check_terminated()
        try:
            parts = srv.recv_parts(timeout_s=max(0.01, min(0.5, deadline - time.monotonic())))
            break
        except TimeoutError:
            if time.monotonic() >= deadline:
                raise OwlError(f"no plan from the server {server[0]}/{server[1]} within {spec.round_timeout_s} s"
                               ) from None
    plan, _ = unpack_message(parts, TO_WORKER, "server")
    if not isinstance(plan, DeployPlan):
        raise OwlError(f"expected the plan from the server, got {plan.TYPE!r}")
    try:
        role = _worker_role(plan, ep.cluster, ep.rank)
    except ValueError:
        raise OwlError(f"the server's plan does not name this worker {ep.cluster}/{ep.rank} (it names "
                       f"{list(plan.workers)[:8]}); start the server with --workers including it") from None
    worker = _OwlWorker(mb, srv, server, task, spec, role, refused)
    with _receivers(mb, worker.addr, worker.inbox, spec.round_timeout_s):
        stats = worker.run()
        ep.flush(timeout_s=10)
        return stats


@dataclass(frozen=True, slots=True)
class _WorkerRole:
    """A worker's part in the deploy plan."""

    me: int  # its index among the workers
    peers: tuple[tuple[str, int], ...]  # every worker, (cluster, rank), in the plan's order
    groups: tuple[tuple[int, ...], ...]  # the branches of each model group
    serves: tuple[tuple[int, int], ...]  # (group, worker) it forwards each group it receives to
    combiner: int | None  # its cluster's combiner (combine=cluster), else None: every worker sends to the server
    members: tuple[int, ...]  # for the combiner, the cluster's other workers (whose updates it averages)
    sources: tuple[tuple[int, int], ...] = ()  # (group, source) it pulls: a worker index, or -1 (the server)


def _worker_role(plan: DeployPlan, cluster: str, rank: int) -> _WorkerRole:
    """The part of the worker `cluster`/`rank` in `plan` (ValueError when the plan does not name it)."""
    names = [tuple(w.split("/")) for w in plan.workers]
    peers = [(c, int(r)) for c, r in names]
    me = peers.index((cluster, rank))
    serves = [(g, w) for w, ps in enumerate(plan.pulls) for g, src in ps if src == me]
    if plan.combine == "cluster":
        combiner = min(i for i, p in enumerate(peers) if p[0] == cluster)
        members = [i for i, p in enumerate(peers) if p[0] == cluster and i != me] if combiner == me else []
    else:
        combiner, members = None, []
    return _WorkerRole(me, tuple(peers), tuple(tuple(g) for g in plan.groups), tuple(serves), combiner,
                       tuple(members), tuple(plan.pulls[me]))


class _OwlWorker:
    """A worker's rounds, each in three phases: train (the first step's forward overlapped with the groups'
    arrival, forwarding each group on), exchange (its update to its combiner or the server; a combiner averages its
    cluster's first), and the wait for the next round's first message or STOP."""

    def __init__(self, mb: Messenger, srv, server: tuple[str, int], task: OwlTask, spec: OwlSpec,  # noqa: ANN001
                 role: _WorkerRole, refused: RefusalSink | None = None) -> None:
        import paddle

        self.mb, self.srv, self.spec, self.role, self.refused = mb, srv, spec, role, refused
        self.name = f"owl worker {role.me}"
        self.model = task.model()
        self.branches, key_branch = model_branches(self.model)
        if sorted(b for g in role.groups for b in g) != list(range(len(self.branches))):
            raise OwlError(f"the server's plan groups branches {[list(g) for g in role.groups][:8]}, not this "
                           f"model's {len(self.branches)} branches each once; run the same model on every actor")
        self.params = dict(self.model.named_parameters())
        # what a peer's tensors are checked against: the model's keys, shapes and dtypes, whole and per group
        self.like = {k: v.numpy() for k, v in self.model.state_dict().items()}
        self.group_like = [{k: v for k, v in self.like.items() if key_branch[k] in g} for g in role.groups]
        self.fwd = OverlappedForward(self.model, self.branches)
        self.opt = paddle.optimizer.SGD(learning_rate=spec.lr, parameters=self.model.parameters())
        self.addr = {"server": Peer(*server), **{i: Peer(c, r) for i, (c, r) in enumerate(role.peers) if i != role.me}}
        self.inbox: queue.Queue = queue.Queue()
        self.data = task.batches(role.me, len(role.peers))
        self.max_examples = spec.local_steps * _batch_of(task, len(role.peers))  # what a member's update may claim
        self.stats = {"rounds": 0, "dist_s": [], "order": [], "pulled": 0, "forwarded_bytes": 0}
        self.rnd, self.stopped, self.early = 0, False, []
        self._new_round()

    def _new_round(self) -> None:
        self.arrived: set[int] = set()  # branches whose weights arrived this round
        self.peer_updates: dict = {}
        self.first_s: float | None = None  # when the round's first group arrived
        self.dist_s: float | None = None  # from then until every group was in

    def run(self) -> dict:
        """Rounds until STOP; what the worker measured."""
        while not self.stopped:
            self._new_round()
            n = self._train()
            if n is None:
                break
            self._exchange(n)
            self._await_next_round()
        return self.stats

    # ---- messages: one handler per type ----
    def handle(self, who, head: dict | None, arrays) -> None:  # noqa: ANN001
        msg = _decoded(self._peer(who) if head is not None else who, head, arrays, TO_WORKER, self.name,
                       refused=self.refused)
        on = self._HANDLERS.get(type(msg))
        if on is not None:
            on(self, who, msg, arrays)

    def _peer(self, who) -> str:  # noqa: ANN001
        """A sender as a refusal names it: "server", or the worker's cluster/rank."""
        return who if who == "server" else "/".join(map(str, self.role.peers[who]))

    def _no(self, who, msg, field: str, value, expected: str) -> None:  # noqa: ANN001
        """Refuse `msg` from `who` (its one log line, with the sender's cluster/rank)."""
        _refuse(self.name, self._peer(who), msg, field, value, expected, self.refused)

    def _on_stop(self, who, msg: Stop, arrays) -> None:  # noqa: ANN001
        if who != "server":
            self._no(who, msg, "sender", self._peer(who), "the server (only the server stops a worker)")
            return
        self.stopped = True

    def _on_update(self, who, msg: OwlUpdate, arrays) -> None:  # noqa: ANN001
        """A cluster member's update, kept for the combiner's average when it is one it expects."""
        if who not in self.role.members:
            self._no(who, msg, "sender", self._peer(who), f"a worker of its cluster "
                     f"{[self._peer(m) for m in self.role.members]} (only a combiner takes updates, from its own)")
        elif msg.round != self.rnd:
            if msg.round > self.rnd:
                self._no(who, msg, "round", msg.round, f"{self.rnd} (the round in progress)")
        elif msg.num_updates != 1 or who in self.peer_updates:
            self._no(who, msg, "num_updates", msg.num_updates, "one update of its own per round")
        elif msg.num_examples > self.max_examples:
            self._no(who, msg, "num_examples", msg.num_examples,
                     f"1..{self.max_examples} (local_steps x the task's batch)")
        elif (why := _model_refusal(arrays, self.like, self._peer(who), msg.num_examples)) is not None:
            self._no(who, msg, "model", why, "this model's tensors")
        else:
            self.peer_updates[who] = (arrays, msg.num_examples)

    def _group_ok(self, who, msg: ModelGroup, arrays) -> bool:  # noqa: ANN001
        """Whether a group is one of the plan's, of the round in progress (an earlier round's is dropped), from the
        server or the peer the plan names for it, with that group's tensors."""
        g, d = msg.group, len(self.role.groups)
        if not 0 <= g < d:
            self._no(who, msg, "group", g, f"a group index in 0..{d - 1}")
        elif who != "server" and (g, who) not in self.role.sources:
            self._no(who, msg, "sender", self._peer(who), f"the server or the worker the plan names for group {g}")
        elif msg.round > self.rnd:
            self._no(who, msg, "round", msg.round, f"{self.rnd} (the round in progress)")
        elif msg.round == self.rnd:
            why = _model_refusal(arrays, self.group_like[g], self._peer(who))
            if why is None:
                return True
            self._no(who, msg, "model", why, f"group {g}'s tensors")
        return False

    def _on_group(self, who, msg: ModelGroup, arrays) -> None:  # noqa: ANN001
        """Load a group's weights and forward the group to the workers that pull it from this one."""
        g, groups = msg.group, self.role.groups
        if not self._group_ok(who, msg, arrays) or set(groups[g]) <= self.arrived:
            return  # refused, or a group pulled from the server after all and the peer's copy came too
        self.first_s = self.first_s or time.monotonic()
        state = self.model.state_dict()
        for k, v in arrays.items():
            (self.params[k] if k in self.params else state[k]).set_value(v)
        self.arrived.update(groups[g])
        for gg, w in self.role.serves:
            if gg == g:
                sent = _send_model(self.mb, self.addr[w], ModelGroup(round=self.rnd, group=g), arrays)
                self.stats["forwarded_bytes"] += sent
        if len(self.arrived) == len(self.branches):
            self.dist_s = time.monotonic() - self.first_s

    _HANDLERS = {Stop: _on_stop, OwlUpdate: _on_update, ModelGroup: _on_group}

    # ---- train ----
    def _wait(self) -> None:
        """The overlapped forward waits for a group: the next message, or (a peer is late) a PULL to the server."""
        if self.stopped:
            raise OwlError("stopped")
        try:
            self.handle(*_get(self.inbox, self.spec.peer_timeout_s))
        except queue.Empty:  # a peer is late: pull what is missing from the server (the fallback)
            missing = [g for g, members in enumerate(self.role.groups) if not set(members) <= self.arrived]
            self.srv.send(pack_message(GroupPull(round=self.rnd, groups=tuple(missing))), lane="control")
            self.stats["pulled"] += len(missing)
        if self.stopped:
            raise OwlError("stopped")

    def _train(self) -> int | None:
        """The round's local steps; the examples trained on (None: STOP came while waiting for a group)."""
        import paddle
        import paddle.nn.functional as F

        for item in self.early:
            self.handle(*item)
        self.early = []
        n = 0
        for step in range(self.spec.local_steps):
            x, y = next(self.data)
            xt, yt = paddle.to_tensor(x), paddle.to_tensor(y.reshape(-1, 1).astype("int64"))
            try:
                out = self.fwd.run(xt, self.arrived, self._wait) if step == 0 else self.model(xt)
            except OwlError:
                self.stopped = True
                break
            if step == 0:
                self.stats["order"].append([b for _, b in self.fwd.order])
            loss = F.cross_entropy(out, yt)
            loss.backward()
            self.opt.step()
            self.opt.clear_grad()
            n += len(y)
        return None if self.stopped else n

    # ---- exchange ----
    def _exchange(self, n: int) -> None:
        """The update to the cluster's combiner (over the cluster-local path) or, averaged by a combiner, to the
        server."""
        role = self.role
        self.stats["dist_s"].append(self.dist_s)
        state = {k: v.numpy() for k, v in self.model.state_dict().items()}
        if role.combiner is not None and role.combiner != role.me:
            _send_model(self.mb, self.addr[role.combiner], OwlUpdate(round=self.rnd, num_examples=n), state)
        else:
            num = 1
            if role.members:  # the combiner: average the cluster's updates, one message crosses the WAN
                state, n, num = self._combine(state, n)
            _send_model(self.mb, self.addr["server"], OwlUpdate(round=self.rnd, num_examples=n, num_updates=num),
                        state)
        self.stats["rounds"] += 1
        self.rnd += 1

    def _combine(self, state: dict, n: int) -> tuple[dict, int, int]:
        """The cluster's updates in by round_timeout_s, averaged with this one: (model, examples, updates)."""
        deadline = time.monotonic() + self.spec.round_timeout_s
        while len(self.peer_updates) < len(self.role.members) and not self.stopped and time.monotonic() < deadline:
            try:
                self.handle(*_get(self.inbox, max(0.01, deadline - time.monotonic())))
            except queue.Empty:
                break
        got = [(state, n)] + [self.peer_updates[w] for w in sorted(self.peer_updates)]
        return fedavg(got), sum(c for _, c in got), len(got)

    # ---- the next round ----
    def _await_next_round(self) -> None:
        """The next round's first message (kept for that round), or STOP."""
        try:
            item = _get(self.inbox, self.spec.round_timeout_s)
        except queue.Empty:
            raise OwlError(f"worker {self.role.me}: nothing from the server or peers within "
                           f"round_timeout_s={self.spec.round_timeout_s}") from None
        if item[0] == "server" and isinstance(_decoded(*item, TO_WORKER, self.name, quiet=True), Stop):
            self.stopped = True  # (a STOP from a peer is kept and refused where it is handled)
        else:
            self.early.append(item)
