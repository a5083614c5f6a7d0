"""OWL over Nebula channels: the server sends each model group once (to the central worker of its communication
group) and workers pass groups to each other over the cluster-local path, each starting the forward pass of a
segment as soon as it arrives; after local steps, updates go back and the server averages them (FedAvg).

Channel `owl` between every pair of actors. Server -> worker: PLAN (control) once, GROUP {round, group} + that
group's tensors (bulk), STOP. Worker -> worker: GROUP, as the deploy setting says. Worker -> server: UPDATE
{round, num_examples} + its model (bulk); PULL {round, groups} when a peer has not forwarded a group within
`peer_timeout_s` (the fallback: the server sends it itself). The server leaves out updates later than
`round_timeout_s`; a round with none is an error.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Protocol, Sequence

import numpy as np

from nebula.channel import ChannelError, Endpoint
from nebula.federated.aggregate import fedavg
from nebula.federated.owl.config import OwlSpec
from nebula.federated.owl.deploy import SERVER, DeploySetting, Pull, centralized, deploy
from nebula.federated.owl.grouping import group_branches
from nebula.federated.owl.messages import TO_SERVER, TO_WORKER, Group, GroupPull, OwlUpdate, Plan, Stop
from nebula.federated.owl.model import OverlappedForward, model_branches
from nebula.messaging import Messenger, MessageFamily, Peer, ProtocolError, decode, pack_message, unpack_message

__all__ = ["OwlTask", "OwlError", "OwlResult", "serve_owl", "run_owl_worker", "plan_for", "CHANNEL"]

log = logging.getLogger(__name__)
CHANNEL = "owl"


class OwlError(RuntimeError):
    """The run cannot go on (no update in a round, the server silent)."""


class OwlTask(Protocol):
    """What an OWL run trains: an nn.Sequential with Parallel blocks, local data per worker, held-out data."""

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


def plan_for(sizes: list[int], workers: int | Sequence[str], spec: OwlSpec) -> DeploySetting:
    """The deploy setting of a run: OWL's (given D, or Algorithm 2's choice), or server-only over the same groups.

    `workers` is their number, or each worker's cluster: then every cluster gets its own centralized deployment of
    the same groups (each group leaves the server once per cluster, and peers pass groups only inside a cluster,
    over its cluster-local path); D is chosen for, and bounded by, the smallest cluster.
    """
    clusters = ["_"] * workers if isinstance(workers, int) else list(workers)
    n = len(clusters)
    names = list(dict.fromkeys(clusters))
    members = {c: [i for i, x in enumerate(clusters) if x == c] for c in names}
    smallest = min(len(m) for m in members.values()) if members else 0
    if spec.num_groups is not None:  # more groups than branches or than workers: ValueError naming the limit
        groups = group_branches(sizes, spec.num_groups)
        centralized(smallest, groups)
    else:
        groups = list(deploy(sizes, smallest, server_bytes_per_s=spec.server_bytes_per_s,
                             peer_bytes_per_s=spec.peer_bytes_per_s)[0].groups)
    pulls: list = [None] * n
    for c, idx in members.items():
        local = centralized(len(idx), groups)
        for j, ps in enumerate(local.pulls):
            pulls[idx[j]] = tuple(Pull(p.group, SERVER if spec.distribution == "server" or p.source == SERVER
                                       else idx[p.source]) for p in ps)
    if spec.distribution == "server":
        pulls = [tuple(Pull(g, SERVER) for g in range(len(groups))) for _ in range(n)]
    return DeploySetting(n, tuple(tuple(g) for g in groups), tuple(pulls))


def _accuracy(model, x: np.ndarray, y: np.ndarray) -> float:
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


def _decoded(who, head: dict | None, arrays, family, role: str, quiet: bool = False):  # noqa: ANN001,ANN202
    """The typed message of a received header (None: a receive error or a malformed header, logged)."""
    if head is None:
        if not quiet:
            log.warning("%s: from %s: %s", role, who, arrays)
        return None
    try:
        return decode(head, family)
    except ProtocolError as exc:
        if not quiet:
            log.warning("%s: message from %s refused: %s", role, who, exc)
        return None


def _start_receivers(mb: Messenger, peers: dict, inbox: queue.Queue, stop: threading.Event, piece_timeout_s: float
                     ) -> list[threading.Thread]:
    ts = [threading.Thread(target=_receive, args=(mb, peer, who, inbox, stop, piece_timeout_s), daemon=True)
          for who, peer in peers.items()]
    for t in ts:
        t.start()
    return ts


def _send_model(mb: Messenger, peer: Peer, msg, weights: dict) -> int:  # noqa: ANN001
    """Send `msg` with `weights` as a model (inline when small, else in pieces); the bytes that left."""
    before = sum(mb.sent_bytes.values())
    mb.send_model(peer, msg, weights, lane="bulk", inline=True)
    return sum(mb.sent_bytes.values()) - before


def _messenger(ep: Endpoint, inbox: MessageFamily) -> Messenger:
    return Messenger(ep, inbox, channel=CHANNEL)


def serve_owl(ep: Endpoint, workers: list[tuple[str, int]], task: OwlTask, spec: OwlSpec,
              should_stop: Callable[[], bool] | None = None) -> OwlResult:
    """Run `spec.rounds` rounds of federated training with OWL (or server-only) distribution, fewer when
    `should_stop()` turns true between rounds; what was measured."""
    import paddle

    model = task.model()
    branches, key_branch = model_branches(model)
    sizes = [b.nbytes for b in branches]
    setting = plan_for(sizes, [c for c, _ in workers], spec)
    group_of = {b: g for g, members in enumerate(setting.groups) for b in members}
    group_keys = [[k for k, b in key_branch.items() if group_of[b] == g] for g in range(len(setting.groups))]
    res = OwlResult(distribution=spec.distribution, num_groups=len(setting.groups),
                    group_bytes=[sum(sizes[b] for b in g) for g in setting.groups])
    x_test, y_test = task.test_data()
    res.initial_accuracy = _accuracy(model, x_test, y_test)
    mb = _messenger(ep, TO_SERVER)
    addr = {w: Peer(*w) for w in workers}
    chans = {w: mb.channel(p) for w, p in addr.items()}
    inbox: queue.Queue = queue.Queue()
    stop = threading.Event()
    threads = _start_receivers(mb, addr, inbox, stop, spec.round_timeout_s)
    try:
        # with combine=cluster the first worker of each cluster averages its cluster's updates (FEDn's combiner)
        # and one update per cluster crosses the WAN; with combine=server every worker sends its own
        combiners = {c: (c, r) for c, r in reversed(workers)}
        senders = set(combiners.values()) if spec.combine == "cluster" else set(workers)
        plan = Plan(workers=tuple(f"{c}/{r}" for c, r in workers), combine=spec.combine,
                    groups=tuple(tuple(g) for g in setting.groups),
                    pulls=tuple(tuple((p.group, p.source) for p in ps) for ps in setting.pulls), rounds=spec.rounds)
        for ch in chans.values():
            ch.send(pack_message(plan), lane="control")
        weights = {k: v.numpy().copy() for k, v in model.state_dict().items()}
        for rnd in range(spec.rounds):
            if rnd and should_stop is not None and should_stop():
                break
            t0 = time.monotonic()
            egress = 0

            def send_group(g: int, w: tuple[str, int]) -> int:
                return _send_model(mb, addr[w], Group(round=rnd, group=g), {k: weights[k] for k in group_keys[g]})

            for g, wi in sorted(setting.from_server(), key=lambda gw: (gw[1], gw[0])):
                egress += send_group(g, workers[wi])
            updates: dict = {}
            counts: dict = {}
            deadline = t0 + spec.round_timeout_s
            while len(updates) < len(senders) and time.monotonic() < deadline:
                try:
                    who, head, arrays = inbox.get(timeout=max(0.01, deadline - time.monotonic()))
                except queue.Empty:
                    break
                msg = _decoded(who, head, arrays, TO_SERVER, "owl server")
                if isinstance(msg, OwlUpdate) and msg.round == rnd:
                    updates[who] = (arrays, msg.num_examples)
                    counts[who] = msg.num_updates
                elif isinstance(msg, GroupPull) and msg.round == rnd:
                    for g in msg.groups:
                        egress += send_group(g, who)
                        res.pulls_served += 1
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
        for ch in chans.values():
            ch.send(pack_message(Stop()), lane="control")
        model.set_state_dict({k: paddle.to_tensor(v) for k, v in weights.items()})
        res.accuracy = _accuracy(model, x_test, y_test)
        ep.flush(timeout_s=10)
        return res
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=2)


def run_owl_worker(ep: Endpoint, server: tuple[str, int], task: OwlTask, spec: OwlSpec) -> dict:
    """One worker: receive groups (from the server or peers), forward them on, train overlapped, send updates."""
    import paddle
    import paddle.nn.functional as F

    mb = _messenger(ep, TO_WORKER)
    srv = mb.channel(Peer(*server))
    try:
        plan, _ = unpack_message(srv.recv_parts(timeout_s=spec.round_timeout_s), TO_WORKER, "server")
    except TimeoutError:
        raise OwlError(f"no plan from the server {server[0]}/{server[1]} within {spec.round_timeout_s} s") from None
    if not isinstance(plan, Plan):
        raise OwlError(f"expected the plan from the server, got {plan.TYPE!r}")
    names = [tuple(w.split("/")) for w in plan.workers]
    peers = [(c, int(r)) for c, r in names]
    me = peers.index((ep.cluster, ep.rank))
    groups = [list(g) for g in plan.groups]
    pulls = [list(ps) for ps in plan.pulls]
    serves = [(g, w) for w, ps in enumerate(pulls) for g, src in ps if src == me]
    if plan.combine == "cluster":
        combiner = min(i for i, p in enumerate(peers) if p[0] == ep.cluster)
        members = [i for i, p in enumerate(peers) if p[0] == ep.cluster and i != me] if combiner == me else []
    else:
        combiner, members = None, []
    model = task.model()
    branches, key_branch = model_branches(model)
    params = dict(model.named_parameters())
    fwd = OverlappedForward(model, branches)
    opt = paddle.optimizer.SGD(learning_rate=spec.lr, parameters=model.parameters())
    addr = {"server": Peer(*server), **{i: Peer(c, r) for i, (c, r) in enumerate(peers) if i != me}}
    inbox: queue.Queue = queue.Queue()
    stop = threading.Event()
    threads = _start_receivers(mb, addr, inbox, stop, spec.round_timeout_s)
    data = task.batches(me, len(peers))
    stats = {"rounds": 0, "dist_s": [], "order": [], "pulled": 0, "forwarded_bytes": 0}
    try:
        rnd, stopped, early = 0, False, []
        while not stopped:
            arrived: set[int] = set()
            peer_updates: dict = {}
            t_first = [None, None]  # first group of the round, all groups

            def handle(who, h, arrays) -> None:
                nonlocal stopped
                msg = _decoded(who, h, arrays, TO_WORKER, f"owl worker {me}")
                if isinstance(msg, Stop):
                    stopped = True
                elif isinstance(msg, OwlUpdate) and msg.round == rnd:
                    peer_updates[who] = (arrays, msg.num_examples)
                elif isinstance(msg, Group) and msg.round == rnd:
                    g = msg.group
                    if set(groups[g]) <= arrived:
                        return  # a group pulled from the server after all, and the peer's copy came too
                    t_first[0] = t_first[0] or time.monotonic()
                    state = model.state_dict()
                    for k, v in arrays.items():
                        (params[k] if k in params else state[k]).set_value(v)
                    arrived.update(groups[g])
                    for gg, w in serves:
                        if gg == g:
                            stats["forwarded_bytes"] += _send_model(mb, addr[w], Group(round=rnd, group=g), arrays)
                    if len(arrived) == len(branches):
                        t_first[1] = time.monotonic() - t_first[0]

            def wait() -> None:
                if stopped:
                    raise OwlError("stopped")
                try:
                    handle(*inbox.get(timeout=spec.peer_timeout_s))
                except queue.Empty:  # a peer is late: pull what is missing from the server (the fallback)
                    missing = [g for g, members in enumerate(groups) if not set(members) <= arrived]
                    srv.send(pack_message(GroupPull(round=rnd, groups=tuple(missing))), lane="control")
                    stats["pulled"] += len(missing)
                if stopped:
                    raise OwlError("stopped")

            for item in early:
                handle(*item)
            early = []
            n = 0
            for step in range(spec.local_steps):
                x, y = next(data)
                xt, yt = paddle.to_tensor(x), paddle.to_tensor(y.reshape(-1, 1).astype("int64"))
                try:
                    out = fwd.run(xt, arrived, wait) if step == 0 else model(xt)
                except OwlError:
                    stopped = True
                    break
                if step == 0:
                    stats["order"].append([b for _, b in fwd.order])
                loss = F.cross_entropy(out, yt)
                loss.backward()
                opt.step()
                opt.clear_grad()
                n += len(y)
            if stopped:
                break
            stats["dist_s"].append(t_first[1])
            state = {k: v.numpy() for k, v in model.state_dict().items()}
            if combiner is not None and combiner != me:  # to the cluster's combiner, over the cluster-local path
                _send_model(mb, addr[combiner], OwlUpdate(round=rnd, num_examples=n), state)
            else:
                num = 1
                if members:  # the combiner: average the cluster's updates, one message crosses the WAN
                    deadline = time.monotonic() + spec.round_timeout_s
                    while len(peer_updates) < len(members) and not stopped and time.monotonic() < deadline:
                        try:
                            handle(*inbox.get(timeout=max(0.01, deadline - time.monotonic())))
                        except queue.Empty:
                            break
                    got = [(state, n)] + [peer_updates[w] for w in sorted(peer_updates)]
                    state, n, num = fedavg(got), sum(c for _, c in got), len(got)
                _send_model(mb, addr["server"], OwlUpdate(round=rnd, num_examples=n, num_updates=num), state)
            stats["rounds"] += 1
            rnd += 1
            try:  # the next round's first group (kept for the next pass), or STOP
                item = inbox.get(timeout=spec.round_timeout_s)
            except queue.Empty:
                raise OwlError(f"worker {me}: nothing from the server or peers within "
                               f"round_timeout_s={spec.round_timeout_s}") from None
            if isinstance(_decoded(*item, TO_WORKER, f"owl worker {me}", quiet=True), Stop):
                stopped = True
            else:
                early.append(item)
        ep.flush(timeout_s=10)
        return stats
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=2)
