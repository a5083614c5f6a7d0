"""The one-way mode (Scenario I, Figure 6) on the stage runner: sender rank s computes k results per micro-batch and
sends them to root receiver rank s*k, which scatters them to its k receivers (itself included); after every
optimizer step the receivers all-reduce, then the root sends a small sync tensor back; a sender may run at most
`oneway.sync_lag` steps ahead of the last sync it received. Any number of sender clusters (M3), unequal cluster
sizes and `k: auto` (`probe`). With every stage on one cluster (one rank) the hand-off is local: the same plan
runs in one process (intra-cluster, hot start).
"""
from __future__ import annotations

import json
import logging
from typing import Any

import numpy as np

from nebula.config.schema import ConfigError
from nebula.pipeline.cluster_stages import mean_over_ranks, normalise
from nebula.pipeline.data import rank_micro_batches, step_ids
from nebula.pipeline.hooks import RunHooks, pad_steps
from nebula.pipeline.oneway.plan import plan_for, signatures_agree
from nebula.pipeline.oneway.scatter import Scatter

__all__ = ["OneWayHooks"]

log = logging.getLogger(__name__)

# control keys (step field < 0) of the start-up exchange
_K_STEPS, _K_CHOSEN, _K_SIGNATURE = (-1, 0, 0), (-2, 0, 0), (-3, 0, 0)


class OneWayHooks(RunHooks):
    """The one-way schedule of one rank (sender, receiver, idle receiver, or all stages in one process)."""

    def bind(self, runner: Any) -> None:
        super().bind(runner)
        cfg = runner.cfg
        self.segments = cfg.segments
        self.local = len(self.segments) == 1
        self.is_sender = not self.local and runner.seg < len(self.segments) - 1
        self.scatter: Scatter | None = None  # a receiver rank's hand-off from its root
        self.extra: dict[str, float] = {}  # recipe metrics of the current step (summed over micro-batches)
        self.synced = -1  # a sender's newest step whose sync tensor came back
        if self.local:
            # one process emulates one rank per sender stage and the k receivers of each
            k = cfg.oneway.k if cfg.oneway.k != "auto" else 1
            names = runner.stages.names
            self.plan = plan_for([(n, 1) for n in names[:-1]], names[-1], (len(names) - 1) * k, k)
            return
        self.rcv_cluster = self.segments[-1][0]
        self.rcv_world = cfg.cluster(self.rcv_cluster).world_size
        self.sender_worlds = [(c, cfg.cluster(c).world_size) for c, _ in self.segments[:-1]]
        if cfg.oneway.k != "auto":
            k = cfg.oneway.k
        else:
            from nebula.pipeline.oneway.probe import probe_k

            k = probe_k(runner, self.is_sender, self.rcv_cluster, self.rcv_world, self.sender_worlds)
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
        if self.local:
            return None, None
        if self.is_sender:
            return None, self.plan.root(self.plan.sender_index(self.r.cluster, self.r.rank))
        if not self.plan.is_root(self.r.rank):
            return None, None
        return self.plan.senders[self.plan.sender_of(self.r.rank)][1], None

    def channel_wiring(self, prev_rank: int | None, next_rank: int | None) -> dict:
        """A sender talks to the receiver cluster, a root to its sender's cluster."""
        if self.is_sender:
            return {"next": self.r.links(self.rcv_cluster, next_rank, f"b{self.r.seg}")}
        peer = self.plan.senders[self.plan.sender_of(self.r.rank)][0]
        return {"prev": self.r.links(peer, prev_rank, f"b{[c for c, _ in self.segments].index(peer)}")}

    def wired(self) -> None:
        if not (self.local or self.is_sender):
            self.scatter = Scatter(self.r, self.plan, self.sender_worlds, self.rcv_world)

    # ---- start-up -------------------------------------------------------------------------------------------
    def _signature(self) -> dict:
        sig: dict = {}
        for s in self.r.stages:
            fn = getattr(s.stage, "signature", None)
            if fn is not None:
                sig.update(fn(s.ctx))
        return sig

    def start_step(self) -> int:
        start = super().start_step()
        self.synced = start - 1
        return start

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
            r.next.send_control(_K_STEPS, pad_steps(sorted(steps)))
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

    # ---- one step -------------------------------------------------------------------------------------------
    def _ids(self, step: int, receiver_rank: int) -> list[np.ndarray]:
        t = self.r.cfg.train
        ids = step_ids(step, seed=t.seed, num_examples=self.r.recipe.num_examples, global_batch=t.global_batch)
        return rank_micro_batches(ids, rank=receiver_rank, world_size=self.plan.active, micro_batches=t.micro_batches)

    def step(self, step: int) -> float | None:
        self.extra = {"k": self.plan.k}
        if self.local:
            return self._step_local(step)
        if self.is_sender:
            return self._step_sender(step)
        return self._step_receiver(step)

    def record_fields(self) -> dict[str, Any]:
        return self.extra

    def finish(self) -> None:
        if not self.local and self.is_sender:
            cfg = self.r.cfg
            self._lag_ok(cfg.train.steps + cfg.oneway.sync_lag)  # the receivers' last sync: the same end step

    def _lag_ok(self, step: int) -> None:
        """Wait for the sync tensors a sender needs to run `step` (at most oneway.sync_lag steps ahead)."""
        need = step - 1 - self.r.cfg.oneway.sync_lag
        while self.synced < need:
            self.r.next.recv_control((self.synced + 1, 0, 0))
            self.synced += 1

    def _add_metrics(self, out: Any) -> None:
        for key, v in (getattr(out, "metrics", None) or {}).items():
            self.extra[key] = self.extra.get(key, 0.0) + float(v)

    def _step_sender(self, step: int) -> float:
        r, k, m_count = self.r, self.plan.k, self.r.cfg.train.micro_batches
        self._lag_ok(step)
        s = self.plan.sender_index(r.cluster, r.rank)
        per_sub = [self._ids(step, s * k + j) for j in range(k)]
        loss_sum, n = 0.0, 0
        for m in range(m_count):
            for j in range(k):
                out = r.stages.forward(per_sub[j][m], None)
                if out.send is None:
                    raise RuntimeError("a oneway sender stage must return StageOutput(send=...)")
                r.next.send_array((step, m, j), out.send.detach().numpy(), "forward")
                self._add_metrics(out)
                if out.loss is not None:
                    loss_sum += float(out.loss.numpy())
                    n += 1
                    (out.loss / (m_count * k)).backward()
        r.stages.optimizer_step()
        return mean_over_ranks(loss_sum / max(n, 1), r.world)

    def _step_receiver(self, step: int) -> float:
        import paddle

        r, plan = self.r, self.plan
        scale = r.world / plan.active  # the all-reduce averages over every rank, idle ones add zeros
        loss_sum = 0.0
        if plan.sender_of(r.rank) is None:
            for s in r.stages:
                (sum(p.sum() for p in s.layer.parameters()) * 0.0).backward()
        else:
            mbs = self._ids(step, r.rank)
            for m, ids in enumerate(mbs):
                x = self.scatter.receive((step, m))
                out = r.stages.forward(ids, paddle.to_tensor(x))
                self._add_metrics(out)
                loss_sum += float(out.loss.numpy())
                (out.loss * (scale / len(mbs))).backward()
            loss_sum /= len(mbs)
        self.scatter.meet(f"step/{step}", r.world)  # idle ranks would otherwise sit in the all-reduce past gloo's 30 s
        r.stages.optimizer_step()  # includes the receivers' all-reduce: they sync among themselves first
        loss = mean_over_ranks(loss_sum, r.world) * scale
        if r.prev is not None:  # root: the small sync tensor to its sender
            r.prev.send_control((step, 0, 0), np.array([step, loss], dtype=np.float64))
        return loss

    def _step_local(self, step: int) -> float:
        """All stages in one process: each sender stage produces k results per micro-batch for its receivers, the
        receiver stage learns from all of them; the same arithmetic as the inter-cluster plan."""
        import paddle

        r, plan, m_count = self.r, self.plan, self.r.cfg.train.micro_batches
        *senders, recv = r.stages.items
        loss_sum, gen_loss = 0.0, {s.name: 0.0 for s in senders}
        for i, snd in enumerate(senders):
            per_sub = [self._ids(step, i * plan.k + j) for j in range(plan.k)]
            for m in range(m_count):
                for j in range(plan.k):
                    ids = per_sub[j][m]
                    out = normalise(snd.stage.forward(snd.model, snd.stage.load(ids, snd.ctx), None), False)
                    self._add_metrics(out)
                    if out.loss is not None:
                        gen_loss[snd.name] += float(out.loss.numpy()) / (m_count * plan.k)
                        (out.loss / (m_count * plan.k)).backward()
                    x = paddle.to_tensor(out.send.detach().numpy())
                    d = normalise(recv.stage.forward(recv.model, recv.stage.load(ids, recv.ctx), x), True)
                    self._add_metrics(d)
                    loss_sum += float(d.loss.numpy())
                    (d.loss / (m_count * plan.active)).backward()
        r.stages.optimizer_step()
        for name, v in gen_loss.items():
            self.extra[f"loss/{name}"] = v
        return loss_sum / (m_count * plan.active)


def _encode_json(obj: dict) -> np.ndarray:
    return np.frombuffer(json.dumps(obj, sort_keys=True).encode(), dtype=np.uint8).copy()


def _decode_json(a: np.ndarray) -> dict:
    return json.loads(bytes(np.asarray(a, dtype=np.uint8)).decode())
