"""Scenario I with any number of sender clusters (M3) and clusters of unequal size: the scatter plan and schedule.

Every cluster but the last runs a sender (e.g. one ELECTRA generator per language group); the last cluster runs
the receiver (the discriminator). Sender ranks are numbered across sender clusters in job order; sender rank s
feeds the k receiver ranks s*k .. s*k+k-1 through their root s*k (Figure 6). Receiver ranks beyond S*k (S sender
ranks) idle: they add zero gradients to the all-reduce, so every replica stays identical. With `oneway.k: auto`
rank 0 of every sender cluster times its stages, sends the time and one result to receiver rank 0, which times its
stages on that result and picks k with `choose_k`, bounded by the receiver ranks available. With every stage on
one cluster (one rank) the hand-off is local: the same plan runs in one process (intra-cluster, hot start).
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from nebula.config.schema import ConfigError
from nebula.pipeline.data import rank_micro_batches, step_ids
from nebula.pipeline.oneway import choose_k

__all__ = ["ScatterPlan", "plan_for", "OneWay", "signatures_agree"]

log = logging.getLogger(__name__)

# control keys (step field < 0) of the start-up exchange
_K_STEPS, _K_CHOSEN, _K_SIGNATURE, _K_PROBE, _K_PROBE_K = (-1, 0, 0), (-2, 0, 0), (-3, 0, 0), (-4, 0, 0), (-5, 0, 0)


@dataclass(frozen=True, slots=True)
class ScatterPlan:
    """Which receiver ranks each sender rank feeds: sender s -> root s*k, sub-receivers s*k .. s*k+k-1."""

    senders: tuple[tuple[str, int], ...]  # (cluster, rank) of every sender rank, in job order
    receiver: str
    receiver_world: int
    k: int

    def __post_init__(self) -> None:
        if self.k < 1 or not self.senders:
            raise ValueError(f"scatter plan needs k >= 1 and at least one sender rank, got k={self.k}, "
                             f"{len(self.senders)} sender ranks")
        if self.k > self.receiver_world:
            raise ValueError(f"oneway.k={self.k} is larger than the {self.receiver_world} ranks of receiver cluster "
                             f"{self.receiver}; lower k or give the cluster more ranks")
        if self.active > self.receiver_world:
            raise ValueError(f"{len(self.senders)} sender ranks x k={self.k} need {self.active} ranks on cluster "
                             f"{self.receiver}, it has {self.receiver_world}; lower k or add ranks")

    @property
    def active(self) -> int:
        """Receiver ranks that get data (the rest idle)."""
        return len(self.senders) * self.k

    def sender_index(self, cluster: str, rank: int) -> int:
        """Global index s of sender rank `rank` of `cluster`."""
        return self.senders.index((cluster, rank))

    def root(self, s: int) -> int:
        """Receiver rank that sender s sends to."""
        return s * self.k

    def group(self, s: int) -> list[int]:
        """The k receiver ranks fed by sender s (its root first)."""
        return list(range(s * self.k, (s + 1) * self.k))

    def sender_of(self, receiver_rank: int) -> int | None:
        """Sender index feeding `receiver_rank` (None: an idle rank)."""
        return receiver_rank // self.k if receiver_rank < self.active else None

    def is_root(self, receiver_rank: int) -> bool:
        """True when `receiver_rank` receives from a sender over the WAN."""
        return receiver_rank < self.active and receiver_rank % self.k == 0


def plan_for(senders: list[tuple[str, int]], receiver: str, receiver_world: int, k: int) -> ScatterPlan:
    """Scatter plan for sender clusters given as (cluster, world size) and the receiver cluster."""
    ranks = tuple((c, r) for c, n in senders for r in range(n))
    return ScatterPlan(senders=ranks, receiver=receiver, receiver_world=receiver_world, k=k)


def signatures_agree(mine: dict, theirs: dict) -> str | None:
    """None when every key both signatures carry has the same value; else the first difference, in words."""
    for key in sorted(set(mine) & set(theirs)):
        if mine[key] != theirs[key]:
            return f"{key}: {theirs[key]!r} (sender) != {mine[key]!r} (receiver)"
    return None


class OneWay:
    """The one-way schedule of one rank (sender, receiver, idle receiver, or all stages in one process)."""

    def __init__(self, runner: Any) -> None:  # the runtime's per-rank runner (runtime._Runner)
        self.r = runner
        cfg = runner.cfg
        self.segments = cfg.segments
        self.local = len(self.segments) == 1
        self.is_sender = not self.local and runner.seg < len(self.segments) - 1
        self.scatter_group = None
        self._store_sync = None  # StoreBarrier on the job's TCP store, made on first use
        self.extra: dict[str, float] = {}  # recipe metrics of the current step (summed over micro-batches)
        if self.local:
            # one process emulates one rank per sender stage and the k receivers of each
            k = cfg.oneway.k if cfg.oneway.k != "auto" else 1
            names = [loc.name for loc in runner.locals]
            self.sender_locals = runner.locals[:-1]
            self.plan = plan_for([(n, 1) for n in names[:-1]], names[-1], (len(names) - 1) * k, k)
            return
        self.rcv_cluster = self.segments[-1][0]
        self.rcv_world = cfg.cluster(self.rcv_cluster).world_size
        self.sender_worlds = [(c, cfg.cluster(c).world_size) for c, _ in self.segments[:-1]]
        k = cfg.oneway.k if cfg.oneway.k != "auto" else self._probe_k()
        self.plan = plan_for(self.sender_worlds, self.rcv_cluster, self.rcv_world, k)
        t = cfg.train
        if t.global_batch % (self.plan.active * t.micro_batches):
            raise ConfigError(f"train.global_batch={t.global_batch} must divide evenly over {self.plan.active} "
                              f"receiver ranks x {t.micro_batches} micro-batches (k={k})")
        if not self.is_sender and runner.rank == 0 and self.plan.active < self.rcv_world:
            log.warning("cluster %s: ranks %d..%d idle (k=%d feeds %d of %d ranks)", self.rcv_cluster,
                        self.plan.active, self.rcv_world - 1, k, self.plan.active, self.rcv_world)

    # ---- wiring ---------------------------------------------------------------------------------------------
    def peer_ranks(self) -> tuple[int | None, int | None]:
        """(previous-boundary peer rank, next-boundary peer rank) of this rank."""
        if self.local:
            return None, None
        if self.is_sender:
            return None, self.plan.root(self.plan.sender_index(self.r.cluster, self.r.rank))
        if not self.plan.is_root(self.r.rank):
            return None, None
        return self.plan.senders[self.plan.sender_of(self.r.rank)][1], None

    def channel_wiring(self, prev_rank: int | None, next_rank: int | None) -> dict:
        """Channels to the peer rank: a sender talks to the receiver cluster, a root to its sender's cluster."""
        from nebula.pipeline.links import ChannelLink

        ep = self.r._connect()
        if self.is_sender:
            peer, b, side, rank = self.rcv_cluster, self.r.seg, "next", next_rank
        else:
            s = self.plan.sender_of(self.r.rank)
            peer = self.plan.senders[s][0]
            b, side, rank = [c for c, _ in self.segments].index(peer), "prev", prev_rank
        return {side: {kind: ChannelLink(ep, peer, rank, f"b{b}.{kind}") for kind in ("act", "grad", "ctl")}}

    def setup_groups(self) -> None:
        """Receiver ranks: one scatter group per sender (every rank creates every group, in the same order, one at
        a time, retried together when gloo fails to connect one: see nebula.pipeline.groups)."""
        if self.local or self.is_sender or self.plan.k == 1:
            return
        groups = self._new_groups(self.plan.k)
        s = self.plan.sender_of(self.r.rank)
        self.scatter_group = groups[s] if s is not None else None

    def _new_groups(self, k: int) -> list[Any]:
        """One process group per sender for receivers-per-sender k (a collective: every receiver rank calls it)."""
        from nebula.pipeline.groups import create_groups

        num = sum(n for _, n in self.sender_worlds)
        return create_groups([list(range(s * k, (s + 1) * k)) for s in range(num)], world=self.rcv_world,
                             timeout_s=self.r.cfg.startup_timeout_s, log=log.warning)

    # ---- start-up -------------------------------------------------------------------------------------------
    def _signature(self) -> dict:
        sig: dict = {}
        for loc in self.r.locals:
            fn = getattr(loc.stage, "signature", None)
            if fn is not None:
                sig.update(fn(loc.ctx))
        return sig

    def agree(self, steps: list[int]) -> int:
        """Newest checkpoint step every cluster has (-1: none), and the start barrier; stage signatures (e.g. the
        vocabulary) are compared first, so a mismatch stops every cluster before any training step."""
        import paddle
        import paddle.distributed as dist

        r, wait = self.r, self.r.cfg.startup_timeout_s
        if self.local:
            return max(steps) if steps else -1
        if self.is_sender:
            r.next.send_control(_K_SIGNATURE, _encode_json(self._signature()))
            r.next.send_control(_K_STEPS, _pad(sorted(steps)))
            reply = r.next.recv_control(_K_CHOSEN, wait)
            if reply.dtype == np.uint8:
                raise ConfigError(_decode_json(reply)["error"])
            return int(reply[0])
        chosen, error = max(steps) if steps else -1, ""
        if r.prev is not None:
            theirs = _decode_json(r.prev.recv_control(_K_SIGNATURE, wait))
            diff = signatures_agree(self._signature(), theirs)
            if diff:
                error = (f"cluster {r.prev.peer_cluster} and cluster {r.cluster} were built differently ({diff}); "
                         "give every cluster the same data directory / tokenizer and recipe args")
            common = set(steps) & {int(s) for s in r.prev.recv_control(_K_STEPS, wait) if s >= 0}
            chosen = max(common) if common else -1
        if r.world > 1:
            t = paddle.to_tensor(np.array([chosen if not error else -2], dtype=np.int64))
            dist.all_reduce(t, op=dist.ReduceOp.MIN)
            chosen = int(t.numpy()[0])
        if r.prev is not None:
            r.prev.send_control(_K_CHOSEN, _encode_json({"error": error}) if error else np.array([chosen], np.int64))
        if error:
            raise ConfigError(error)
        if chosen == -2:
            raise ConfigError(f"cluster {r.cluster}: another sender cluster was built differently from this one; "
                              "see the root ranks' logs")
        return chosen

    def _probe_k(self) -> int:
        """k auto: time both sides on real micro-batches, choose k on receiver rank 0, share it with every rank."""
        import paddle
        import paddle.distributed as dist

        from nebula.pipeline.boundary import Boundary
        from nebula.pipeline.links import ChannelLink

        r, cfg = self.r, self.r.cfg
        num = cfg.oneway.probe_micro_batches
        max_k = self.rcv_world // sum(n for _, n in self.sender_worlds)
        per = max(cfg.train.global_batch // (self.rcv_world * cfg.train.micro_batches), 1)
        ids = step_ids(0, seed=cfg.train.seed, num_examples=r.recipe.num_examples, global_batch=per)

        def boundary(peer: str, rank: int, side: str) -> Boundary:
            ep = r._connect()
            links = {kind: ChannelLink(ep, peer, rank, f"probe.{kind}") for kind in ("act", "grad", "ctl")}
            return Boundary(side=side, codec=lambda d, s: "none", peer_timeout_s=cfg.startup_timeout_s, **links)

        k = np.array([0], dtype=np.int64)
        if r.rank == 0 and self.is_sender:
            b = boundary(self.rcv_cluster, 0, "upstream")
            sample, sender_s = _timed(lambda: r._forward_local(ids, None), num, r)
            b.send_control(_K_PROBE, np.array([sender_s], dtype=np.float64))
            b.send_array(_K_PROBE, sample.send.detach().numpy(), "forward")
            k = b.recv_control(_K_PROBE_K, cfg.startup_timeout_s).astype(np.int64)
            b.close()
        elif r.rank == 0:
            times, samples = [], []
            for c, _ in self.sender_worlds:
                b = boundary(c, 0, "downstream")
                times.append(float(b.recv_control(_K_PROBE, cfg.startup_timeout_s)[0]))
                samples.append((b, b.recv_array(_K_PROBE)))
            rcv_s = np.mean([_timed(lambda x=x: r._forward_local(ids, paddle.to_tensor(x)), num, r)[1]
                             for _, x in samples])
            k[0] = choose_k(max(times), float(rcv_s), max_k=max_k)
            log.info("oneway k auto: sender %.4f s, receiver %.4f s per micro-batch -> k=%d (at most %d)",
                     max(times), rcv_s, k[0], max_k)
            for b, _ in samples:
                b.send_control(_K_PROBE_K, k)
                b.flush()
                b.close()
        if r.world > 1:
            t = paddle.to_tensor(k)
            dist.broadcast(t, src=0)
            k = t.numpy()
        t_ = cfg.train
        kk = int(k[0])
        active = sum(n for _, n in self.sender_worlds)
        while kk > 1 and t_.global_batch % (active * kk * t_.micro_batches):
            kk -= 1  # the batch must split over the fed ranks
        return kk

    # ---- one step -------------------------------------------------------------------------------------------
    def _ids(self, step: int, receiver_rank: int) -> list[np.ndarray]:
        t = self.r.cfg.train
        ids = step_ids(step, seed=t.seed, num_examples=self.r.recipe.num_examples, global_batch=t.global_batch)
        return rank_micro_batches(ids, rank=receiver_rank, world_size=self.plan.active, micro_batches=t.micro_batches)

    def step(self, step: int, lag_ok: Callable[[int], None]) -> float | None:
        """Run one optimizer step of this rank; returns the loss it reports (None: none)."""
        self.extra = {"k": self.plan.k}
        if self.local:
            return self._step_local(step)
        if self.is_sender:
            return self._step_sender(step, lag_ok)
        return self._step_receiver(step)

    def _add_metrics(self, out: Any) -> None:
        for key, v in (getattr(out, "metrics", None) or {}).items():
            self.extra[key] = self.extra.get(key, 0.0) + float(v)

    def _step_sender(self, step: int, lag_ok: Callable[[int], None]) -> float:
        r, k, m_count = self.r, self.plan.k, self.r.cfg.train.micro_batches
        lag_ok(step)
        s = self.plan.sender_index(r.cluster, r.rank)
        per_sub = [self._ids(step, s * k + j) for j in range(k)]
        loss_sum, n = 0.0, 0
        for m in range(m_count):
            for j in range(k):
                out = r._forward_local(per_sub[j][m], None)
                if out.send is None:
                    raise RuntimeError("a oneway sender stage must return StageOutput(send=...)")
                r.next.send_array((step, m, j), out.send.detach().numpy(), "forward")
                self._add_metrics(out)
                if out.loss is not None:
                    loss_sum += float(out.loss.numpy())
                    n += 1
                    (out.loss / (m_count * k)).backward()
        r._optimizer_step()
        return r._mean_over_ranks(loss_sum / max(n, 1))

    def _step_receiver(self, step: int) -> float:
        import paddle

        r, plan = self.r, self.plan
        scale = r.world / plan.active  # the all-reduce averages over every rank, idle ones add zeros
        loss_sum = 0.0
        if plan.sender_of(r.rank) is None:
            for loc in r.locals:
                (sum(p.sum() for p in loc.layer.parameters()) * 0.0).backward()
        else:
            mbs = self._ids(step, r.rank)
            for m, ids in enumerate(mbs):
                x = self._receive_scattered((step, m))
                out = r._forward_local(ids, paddle.to_tensor(x))
                self._add_metrics(out)
                loss_sum += float(out.loss.numpy())
                (out.loss * (scale / len(mbs))).backward()
            loss_sum /= len(mbs)
        self._meet(f"step/{step}", r.world)  # idle ranks would otherwise sit in the all-reduce past gloo's 30 s
        r._optimizer_step()  # includes the receivers' all-reduce: they sync among themselves first
        loss = r._mean_over_ranks(loss_sum) * scale
        if r.prev is not None:  # root: the small sync tensor to its sender
            r.prev.send_control((step, 0, 0), np.array([step, loss], dtype=np.float64))
        return loss

    def _receive_scattered(self, key: tuple[int, int]) -> np.ndarray:
        import paddle.distributed as dist

        r, k = self.r, self.plan.k
        if k == 1:
            return r.prev.recv_array((*key, 0))
        out: list[Any] = []
        t0 = time.perf_counter()
        if r.prev is not None:
            parts = [np.asarray(r.prev.recv_array((*key, j))) for j in range(k)]  # host arrays pickle
            t0 = time.perf_counter()
            self._meet(f"scatter/{r.rank}/{key[0]}/{key[1]}", k)
            dist.scatter_object_list(out, parts, src=r.rank, group=self.scatter_group)
        else:
            # wait for the root in the TCP store, not in gloo: the root may wait on the WAN past gloo's 30 s timeout
            self._meet(f"scatter/{r.rank - r.rank % k}/{key[0]}/{key[1]}", k)
            dist.scatter_object_list(out, None, src=r.rank - r.rank % k, group=self.scatter_group)
        r._scatter_wait += time.perf_counter() - t0
        return out[0]

    def _meet(self, name: str, n: int) -> None:
        """Barrier of `n` receiver ranks kept in the job's TCP store: ranks wait there (bounded by peer_timeout_s)
        instead of inside a gloo collective, which fails after 30 s when a peer is late (nebula.pipeline.groups)."""
        if n < 2:
            return
        if self._store_sync is None:
            from nebula.pipeline.groups import StoreBarrier, job_store

            self._store_sync = StoreBarrier(job_store(), 0, self.r.cfg.peer_timeout_s)
        self._store_sync.wait(f"nebula/oneway/{name}", f"cluster {self.r.cluster}: {name}", world=n)

    def _step_local(self, step: int) -> float:
        """All stages in one process: each sender stage produces k results per micro-batch for its receivers, the
        receiver stage learns from all of them; the same arithmetic as the inter-cluster plan."""
        import paddle

        r, plan, m_count = self.r, self.plan, self.r.cfg.train.micro_batches
        recv = r.locals[-1]
        loss_sum, gen_loss = 0.0, {loc.name: 0.0 for loc in self.sender_locals}
        for s, loc in enumerate(self.sender_locals):
            per_sub = [self._ids(step, s * plan.k + j) for j in range(plan.k)]
            for m in range(m_count):
                for j in range(plan.k):
                    ids = per_sub[j][m]
                    out = _normalise(loc.stage.forward(loc.model, loc.stage.load(ids, loc.ctx), None), False)
                    self._add_metrics(out)
                    if out.loss is not None:
                        gen_loss[loc.name] += float(out.loss.numpy()) / (m_count * plan.k)
                        (out.loss / (m_count * plan.k)).backward()
                    x = paddle.to_tensor(out.send.detach().numpy())
                    d = _normalise(recv.stage.forward(recv.model, recv.stage.load(ids, recv.ctx), x), True)
                    self._add_metrics(d)
                    loss_sum += float(d.loss.numpy())
                    (d.loss / (m_count * plan.active)).backward()
        r._optimizer_step()
        for name, v in gen_loss.items():
            self.extra[f"loss/{name}"] = v
        return loss_sum / (m_count * plan.active)


def _normalise(out: Any, last: bool) -> Any:
    from nebula.pipeline.stage import StageOutput

    if isinstance(out, StageOutput):
        return out
    return StageOutput(loss=out) if last else StageOutput(send=out)


def _timed(fn: Callable[[], Any], num: int, r: Any) -> tuple[Any, float]:
    """Run forward + backward `num` times (gradients dropped); the last output and the median seconds."""
    out, times = None, []
    with r._no_sync():  # only this rank runs the probe: no data-parallel all-reduce inside backward
        for _ in range(num + 1):  # the first call warms up
            t0 = time.perf_counter()
            out = fn()
            if out.loss is not None:
                out.loss.backward()
            times.append(time.perf_counter() - t0)
    for loc in r.locals:
        loc.opt.clear_grad()
    return out, float(np.median(times[1:]))


def _pad(steps: list[int], pad: int = 64) -> np.ndarray:
    a = np.full(pad, -1, dtype=np.int64)
    v = steps[-pad:]
    a[:len(v)] = v
    return a


def _encode_json(obj: dict) -> np.ndarray:
    return np.frombuffer(json.dumps(obj, sort_keys=True).encode(), dtype=np.uint8).copy()


def _decode_json(a: np.ndarray) -> dict:
    return json.loads(bytes(np.asarray(a, dtype=np.uint8)).decode())
