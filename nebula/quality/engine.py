"""Every cross-cluster mode on the same model and the same tokens, in one process, with the WAN's bytes counted.

The model is a `nebula.formers.CausalLMRecipe` (a PaddleFormers causal LM from a local directory) built exactly as
the runtime builds it (`build_layers` seeded per layer from the job seed), and every row sees the same examples in
the same order: step s's `global_batch` example ids are the runtime's `step_ids(s, seed, ...)`, one contiguous block
per cluster in data-parallel rows (as `mode: data_parallel` cuts them) and micro-batches in the pipeline. What
crosses the WAN goes through the real codec (`nebula.compress`) and is decoded on the other side, so lossy codecs
change training exactly as they would over the link; `Encoded.nbytes` (the frames' lengths, headers included) is
counted. Time on the link is not simulated here: each row records its critical-path compute (the clusters run in
parallel: the slower cluster per step, or the pipeline's fill and drain) and its `Traffic`, and
`nebula.plan.link.predicted_wall_s` turns them into wall time per link.

Rows (two clusters, A and B):
- one-cluster: one model, the whole batch; nothing crosses a WAN.
- all-reduce: each cluster's gradient of its block through the codec to the other, averaged, every step.
- pipeline: embeddings and the first half of the decoder layers in A, the rest in B; per micro-batch the hidden
  states go forward and their gradients back through the codec; with N-step-stale weights A applies each step's
  gradient N steps late (PipeDream-2BW, `nebula.pipeline.stale`), B steps at once; both drain at the end.
  A keyed codec (`delta(...)`, AQ-SGD's activation deltas) gets each micro-batch's example ids and decodes with a
  receiving instance of its own, so both caches evolve as over the link; deltas pay only when examples come again
  (`Budget.train_examples` below the tokens' sequences: more than one epoch).
- diloco: a replica per cluster with its own AdamW; every `sync_every` steps each sends its pseudo-gradient (anchor -
  replica) through the codec, and both apply DiLoCo's outer Nesterov step to the mean (`nebula.dataparallel.outer`).
- streaming-diloco (Streaming DiLoCo, Douillard et al. 2025): the model's values, in layer order, cut into
  `fragments` equal slices; slice f is sent every `sync_every` steps at its own offset (f + 1) * H / F, so one
  F-th of the model crosses at a time (peak bandwidth / F); each slice has its own outer momentum; with `delay` tau
  the send overlaps tau inner steps and the outer result is merged then, replica = alpha * replica + (1 - alpha) *
  outer (alpha = `Budget.merge_alpha`, the paper's 0.5; tau 0 replaces at once).
- federated: FedAvg over `clients` clients per cluster (each a share of the cluster's block, its own AdamW); every
  `sync_every` local steps each cluster's combiner averages its clients on the LAN and sends the partial through the
  codec to the reducer in cluster A, which sends the new global model back: one model each way per round.
"""
from __future__ import annotations

import dataclasses
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from nebula.dataparallel.outer import outer_step
from nebula.quality.rows import RowResult, RowSpec, Traffic

__all__ = ["Budget", "Bench", "CLUSTERS"]

CLUSTERS = 2
ProgressCallback = Callable[[int, int], None]  # (steps done, steps in all)


@dataclass(frozen=True)
class Budget:
    """The compute every row gets: `steps` optimizer steps of `global_batch` sequences of `seq_len` tokens (all
    clusters together), `micro_batches` per step in the pipeline, inner learning rate `lr`, DiLoCo's outer step."""

    steps: int
    global_batch: int = 8
    seq_len: int = 64
    micro_batches: int = 2
    lr: float = 1e-3
    seed: int = 1
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    clients: int = 2  # federated: clients per cluster
    merge_alpha: float = 0.5  # streaming-diloco with delay: the replica's share when the outer result is merged
    heldout_examples: int = 2000
    train_examples: int = 0  # train on the first N examples only (0: all): epochs > 1 for activation deltas

    def __post_init__(self) -> None:
        if self.train_examples < 0:
            raise ValueError(f"budget: train_examples={self.train_examples} must be >= 0 (0: every example)")
        if self.steps < 1 or self.global_batch < 1 or self.micro_batches < 1 or self.clients < 1:
            raise ValueError(f"budget: steps, global_batch, micro_batches and clients must be >= 1, got {self}")
        for what, parts in (("clusters", CLUSTERS), ("micro_batches", self.micro_batches),
                            ("clusters x clients", CLUSTERS * self.clients)):
            if self.global_batch % parts:
                raise ValueError(f"budget: global_batch={self.global_batch} must split evenly over {what} "
                                 f"({parts}); pick a multiple of {parts}")

    @property
    def tokens(self) -> int:
        """Token positions trained on (sequences x seq_len) over the run, the same for every row."""
        return self.steps * self.global_batch * self.seq_len


class _Clock:
    """Seconds of compute per cluster within one step, for the critical path."""

    def __init__(self) -> None:
        self.total = 0.0

    def step(self, per_cluster: list[float]) -> None:
        self.total += max(per_cluster)


def _params(model: Any) -> dict[str, np.ndarray]:
    return {k: v.numpy().copy() for k, v in model.state_dict().items()}


def _load(model: Any, state: dict[str, np.ndarray]) -> None:
    for k, v in model.state_dict().items():
        v.set_value(state[k])


def _flat(model: Any) -> np.ndarray:
    """Every value of `model` in one float32 vector, in state-dict (layer) order."""
    return np.concatenate([v.numpy().reshape(-1) for v in model.state_dict().values()]).astype("float32")


def _load_flat(model: Any, flat: np.ndarray) -> None:
    at = 0
    for v in model.state_dict().values():
        n = int(np.prod(v.shape))
        v.set_value(flat[at:at + n].reshape(v.shape).astype(v.numpy().dtype, copy=False))
        at += n


def _grads(model: Any) -> list[np.ndarray]:
    return [p.grad.numpy().copy() if p.grad is not None else np.zeros(p.shape, "float32")
            for p in model.parameters()]


def _set_grads(model: Any, grads: list[np.ndarray]) -> None:
    for p, g in zip(model.parameters(), grads):
        if p.grad is not None:
            p.grad.set_value(g.astype("float32", copy=False))


class _Wire:
    """One sender's side of the WAN: a codec instance per tensor it sends (error-feedback residuals and warm starts
    are per tensor, as the runtime keeps them: `ClusterMean` per tensor name, a pipeline boundary per channel), the
    bytes counted."""

    def __init__(self, spec: str) -> None:
        self.spec = spec
        self._codecs: dict[Any, Any] = {}
        self.bytes = 0

    def send(self, x: np.ndarray, key: Any = None, ids: np.ndarray | None = None) -> tuple[np.ndarray, int]:
        """`x` through the codec of tensor `key` and back, as the receiver decodes it; (decoded, bytes sent). A keyed
        codec (activation deltas) gets each row's example id `ids` and decodes with a receiver of its own."""
        from nebula.compress import decode_encoded, get_codec
        from nebula.compress.delta import is_keyed

        codec = self._codecs.get(key)
        if codec is None:
            codec = self._codecs[key] = get_codec(self.spec)
        if is_keyed(codec):
            recv = self._codecs.get(("receiver", key))
            if recv is None:
                recv = self._codecs[("receiver", key)] = get_codec(self.spec)
            enc = codec.encode_keyed(x, ids)
            y = recv.decode(enc)
        else:
            enc = codec.encode(x)
            y = decode_encoded(enc)
        self.bytes += enc.nbytes
        return np.asarray(y, dtype=x.dtype).reshape(x.shape), enc.nbytes

    @property
    def cache_bytes(self) -> int:
        """Bytes the keyed codecs' caches hold on the sending end (the receiving end holds as many)."""
        return sum(getattr(c, "cache_bytes", 0) for k, c in self._codecs.items()
                   if not (isinstance(k, tuple) and k[:1] == ("receiver",)))


class Bench:
    """The model, training data and held-out data loaded once; `run(spec, budget)` trains one row."""

    def __init__(self, model_dir: str | Path, train: str | Path, heldout: str | Path, *, seq_len: int = 64,
                 lr: float = 1e-3, heldout_examples: int = 2000) -> None:
        from nebula.formers import CausalLMRecipe
        from nebula.formers.data import TokenData, load_tokenizer, read_lines

        self.recipe = CausalLMRecipe(from_pretrained=str(model_dir), data=str(train), seq_len=seq_len,
                                     num_stages=1, lr=lr)
        self.layered = self.recipe.model
        lines = read_lines(heldout, "heldout")[:heldout_examples]
        self.heldout = TokenData(lines, load_tokenizer(self.recipe.info.path), seq_len)
        self.seq_len, self.lr = seq_len, lr

    # -- pieces ---------------------------------------------------------------------------------------------
    def _check(self, budget: Budget) -> None:
        if budget.seq_len != self.seq_len or budget.lr != self.lr:
            raise ValueError(f"budget seq_len={budget.seq_len}, lr={budget.lr} differ from the bench's "
                             f"({self.seq_len}, {self.lr}); build the Bench with the budget's values")

    def _build(self, seed: int, start: int = 0, stop: int | None = None) -> Any:
        import paddle

        from nebula.hybrid.layered import build_layers

        stop = self.layered.num_layers if stop is None else stop
        return paddle.nn.Sequential(*build_layers(self.layered, start, stop, seed))

    def _opt(self, model: Any) -> Any:
        return self.layered.build_optimizer(list(model.parameters()))

    def _ids(self, step: int, budget: Budget) -> np.ndarray:
        from nebula.pipeline.data import step_ids

        n = self.recipe.num_examples
        return step_ids(step, seed=budget.seed, num_examples=min(n, budget.train_examples or n),
                        global_batch=budget.global_batch)

    def _loss(self, model: Any, ids: np.ndarray) -> Any:
        return self.layered.loss(model(self.layered.inputs(ids)), self.layered.targets(ids))

    def _eval(self, model: Any) -> float:
        from nebula.quality.evaluate import heldout_loss

        return heldout_loss(model, self.layered, self.heldout)

    # -- rows ---------------------------------------------------------------------------------------------------
    def run(self, spec: RowSpec, budget: Budget, progress: ProgressCallback | None = None) -> RowResult:
        """Train row `spec` for `budget` and measure it."""
        self._check(budget)
        if spec.epochs:  # a smaller training set seen `epochs` times (activation deltas pay on examples seen again)
            budget = dataclasses.replace(budget, train_examples=max(1, budget.tokens // budget.seq_len // spec.epochs))
        import paddle

        paddle.seed(budget.seed)
        runner = {"one-cluster": self._one_cluster, "all-reduce": self._all_reduce, "pipeline": self._pipeline,
                  "diloco": self._diloco, "streaming-diloco": self._streaming, "federated": self._federated}[spec.mode]
        t0 = time.perf_counter()
        out = runner(spec, budget, progress or (lambda done, total: None))
        wall = time.perf_counter() - t0
        model, wan, peak, traffic, compute, losses, params, extra = out
        tail = losses[-max(1, len(losses) // 20):]
        return RowResult(spec=spec, heldout_loss=self._eval(model), wan_bytes=int(wan), wall_s=wall,
                         compute_s=compute, steps=budget.steps, tokens=budget.tokens, params=params,
                         seed=budget.seed, peak_wan_bytes=int(peak), traffic=traffic,
                         train_loss=float(np.mean(tail)), extra=extra)

    def _one_cluster(self, spec: RowSpec, b: Budget, progress: ProgressCallback) -> tuple:
        from nebula.quality.evaluate import num_params

        model = self._build(b.seed)
        opt = self._opt(model)
        clock, losses = _Clock(), []
        for s in range(b.steps):
            t = time.perf_counter()
            loss = self._loss(model, self._ids(s, b))
            loss.backward()
            opt.step()
            opt.clear_grad()
            losses.append(float(loss))
            clock.step([time.perf_counter() - t])
            progress(s + 1, b.steps)
        return model, 0, 0, Traffic(), clock.total, losses, num_params(model), {}

    def _all_reduce(self, spec: RowSpec, b: Budget, progress: ProgressCallback) -> tuple:
        from nebula.quality.evaluate import num_params

        model = self._build(b.seed)
        opt = self._opt(model)
        wires = [_Wire(spec.codec) for _ in range(CLUSTERS)]
        clock, losses, per_step = _Clock(), [], 0
        for s in range(b.steps):
            blocks = np.split(self._ids(s, b), CLUSTERS)
            sent, times, step_loss = [], [], 0.0
            for c, ids in enumerate(blocks):  # each cluster's gradient of its own block
                t = time.perf_counter()
                loss = self._loss(model, ids)
                loss.backward()
                grads = _grads(model)
                opt.clear_grad()
                times.append(time.perf_counter() - t)
                before = wires[c].bytes
                sent.append([wires[c].send(g, i)[0] for i, g in enumerate(grads)])
                per_step = max(per_step, wires[c].bytes - before)
                step_loss += float(loss) / CLUSTERS
            t = time.perf_counter()
            # ring all-reduce of two: each cluster sends its gradient to the other and both take the mean
            _set_grads(model, [sum(gs) / CLUSTERS for gs in zip(*sent)])
            opt.step()
            opt.clear_grad()
            clock.step([x + time.perf_counter() - t for x in times])
            losses.append(step_loss)
            progress(s + 1, b.steps)
        wan = sum(w.bytes for w in wires)
        traffic = Traffic(exchanges=b.steps, bytes_per_exchange=wan / CLUSTERS / b.steps, latencies_per_exchange=1)
        return model, wan, per_step * CLUSTERS, traffic, clock.total, losses, num_params(model), {}

    def _pipeline(self, spec: RowSpec, b: Budget, progress: ProgressCallback) -> tuple:
        import paddle

        from nebula.formers.recipe import stage_bounds
        from nebula.quality.evaluate import num_params

        bounds = stage_bounds(self.layered.num_hidden_layers, 2)
        stage_a = self._build(b.seed, 0, bounds[1])
        stage_b = self._build(b.seed, bounds[1], bounds[2])
        opt_a, opt_b = self._opt(stage_a), self._opt(stage_b)
        fwd, bwd = _Wire(spec.codec), _Wire(spec.grad_codec or spec.codec)
        pending: deque[list[np.ndarray]] = deque()
        clock, losses, n = _Clock(), [], spec.stale_weights
        for s in range(b.steps):
            ta = tb = 0.0
            step_loss = 0.0
            for ids in np.split(self._ids(s, b), b.micro_batches):
                t = time.perf_counter()
                h = stage_a(self.layered.inputs(ids))
                ta += time.perf_counter() - t
                x, _ = fwd.send(h.numpy(), ids=ids)
                t = time.perf_counter()
                xin = paddle.to_tensor(x, stop_gradient=False)
                loss = self.layered.loss(stage_b(xin), self.layered.targets(ids)) / b.micro_batches
                loss.backward()
                tb += time.perf_counter() - t
                g, _ = bwd.send(xin.grad.numpy())
                t = time.perf_counter()
                h.backward(paddle.to_tensor(g))
                ta += time.perf_counter() - t
                step_loss += float(loss)
            t = time.perf_counter()
            opt_b.step()
            opt_b.clear_grad()
            tb += time.perf_counter() - t
            t = time.perf_counter()
            if n == 0:
                opt_a.step()
            else:  # the gradient of step k (computed on the weights of step k) is applied at step k + n
                pending.append(_grads(stage_a))
                due = [pending.popleft()] if len(pending) > n else []
                if s == b.steps - 1:  # drain at the last step, as the runtime does
                    due += list(pending)
                    pending.clear()
                for grads in due:
                    _set_grads(stage_a, grads)
                    opt_a.step()
            opt_a.clear_grad()
            ta += time.perf_counter() - t
            m = b.micro_batches  # two stages, m micro-batches: the slower stage's work plus one micro-batch of fill
            clock.step([ta, tb] if n else [max(ta, tb) + min(ta, tb) / m])
            losses.append(step_loss)
            progress(s + 1, b.steps)
        wan = fwd.bytes + bwd.bytes
        # the downstream end sends each micro-batch's gradient back at once while the next activation comes
        # forward, and the upstream sends behind its next forward: the first activation and the last gradient are
        # the critical path (one round trip of fill and drain); the link carries the larger direction's step;
        # stale weights hide the transfers, N steps in flight sharing the round trip
        busier = max(fwd.bytes, bwd.bytes) / b.steps
        traffic = Traffic(exchanges=b.steps, bytes_per_exchange=2 * busier / b.micro_batches,
                          latencies_per_exchange=2 / (n + 1), overlapped=bool(n), link_bytes_per_exchange=busier)
        model = paddle.nn.Sequential(*stage_a, *stage_b)
        extra = {"forward_bytes": fwd.bytes, "backward_bytes": bwd.bytes, "cache_bytes": fwd.cache_bytes} \
            if fwd.cache_bytes else {}  # activation deltas: each end's cache, beside the model in its memory
        return model, wan, wan / b.steps, traffic, clock.total, losses, num_params(model), extra

    def _replicas(self, b: Budget, count: int) -> tuple[list[Any], list[Any]]:
        models = [self._build(b.seed) for _ in range(count)]
        return models, [self._opt(m) for m in models]

    def _local_steps(self, models: list[Any], opts: list[Any], s: int, b: Budget) -> tuple[list[float], float]:
        """One inner step of each replica on its block of step `s`'s ids: (seconds per replica, mean loss)."""
        times, step_loss = [], 0.0
        for model, opt, ids in zip(models, opts, np.split(self._ids(s, b), len(models))):
            t = time.perf_counter()
            loss = self._loss(model, ids)
            loss.backward()
            opt.step()
            opt.clear_grad()
            times.append(time.perf_counter() - t)
            step_loss += float(loss) / len(models)
        return times, step_loss

    def _diloco(self, spec: RowSpec, b: Budget, progress: ProgressCallback) -> tuple:
        from nebula.quality.evaluate import num_params

        models, opts = self._replicas(b, CLUSTERS)
        anchor, buf = _params(models[0]), None
        wires = [_Wire(spec.codec) for _ in range(CLUSTERS)]
        clock, losses, syncs, peak = _Clock(), [], 0, 0
        for s in range(b.steps):
            times, step_loss = self._local_steps(models, opts, s, b)
            if (s + 1) % spec.sync_every == 0 or s == b.steps - 1:
                t = time.perf_counter()
                before = sum(w.bytes for w in wires)
                deltas = []
                for model, wire in zip(models, wires):
                    replica = _params(model)
                    deltas.append({k: wire.send(anchor[k] - replica[k], k)[0] for k in anchor})
                mean = {k: sum(d[k] for d in deltas) / CLUSTERS for k in anchor}
                anchor, buf = outer_step(anchor, mean, buf, lr=b.outer_lr, momentum=b.outer_momentum)
                for model in models:
                    _load(model, anchor)
                peak = max(peak, sum(w.bytes for w in wires) - before)
                syncs += 1
                times = [x + time.perf_counter() - t for x in times]
            clock.step(times)
            losses.append(step_loss)
            progress(s + 1, b.steps)
        wan = sum(w.bytes for w in wires)
        traffic = Traffic(exchanges=syncs, bytes_per_exchange=wan / CLUSTERS / syncs, latencies_per_exchange=1)
        return models[0], wan, peak, traffic, clock.total, losses, num_params(models[0]), {"syncs": syncs}

    def _streaming(self, spec: RowSpec, b: Budget, progress: ProgressCallback) -> tuple:
        from nebula.quality.evaluate import num_params

        from nebula.dataparallel.streaming import Fragments

        models, opts = self._replicas(b, CLUSTERS)
        anchor = _flat(models[0])
        frags = Fragments(anchor.size, spec.fragments, spec.sync_every, spec.delay)  # the runtime's schedule
        cuts, tau = frags.cuts, spec.delay
        bufs: list[np.ndarray | None] = [None] * spec.fragments
        wires = [_Wire(spec.codec) for _ in range(CLUSTERS)]
        pending: list[tuple[int, int, np.ndarray]] = []  # (merge after step, fragment, outer result)
        clock, losses, syncs, peak = _Clock(), [], 0, 0
        for s in range(b.steps):
            times, step_loss = self._local_steps(models, opts, s, b)
            t = time.perf_counter()
            last = s == b.steps - 1
            for f in frags.sends(s + 1, b.steps):
                lo, hi = cuts[f], cuts[f + 1]
                before = sum(w.bytes for w in wires)
                flats = [_flat(m) for m in models]
                mean = sum(w.send(anchor[lo:hi] - x[lo:hi], f)[0] for w, x in zip(wires, flats)) / CLUSTERS
                new, buf = outer_step({"f": anchor[lo:hi]}, {"f": mean}, None if bufs[f] is None else {"f": bufs[f]},
                                      lr=b.outer_lr, momentum=b.outer_momentum)
                anchor[lo:hi], bufs[f] = new["f"], buf["f"]
                peak = max(peak, sum(w.bytes for w in wires) - before)
                syncs += 1
                pending.append((s + tau, f, anchor[lo:hi].copy()))
            due = [p for p in pending if p[0] <= s]
            pending = [p for p in pending if p[0] > s]
            if last:  # the final sync sent every fragment: the replicas end as the model all clusters agree on
                for m in models:
                    _load_flat(m, anchor)
                pending, due = [], []
            if due:
                alpha = b.merge_alpha if tau else 0.0
                for m in models:
                    x = _flat(m)
                    for _, f, outer in due:
                        lo, hi = cuts[f], cuts[f + 1]
                        x[lo:hi] = alpha * x[lo:hi] + (1 - alpha) * outer
                    _load_flat(m, x)
            clock.step([x + time.perf_counter() - t for x in times])
            losses.append(step_loss)
            progress(s + 1, b.steps)
        wan = sum(w.bytes for w in wires)
        # a fragment's send overlaps the tau inner steps before its merge (with tau 0 it blocks, as DiLoCo's does)
        traffic = Traffic(exchanges=syncs, bytes_per_exchange=wan / CLUSTERS / syncs, latencies_per_exchange=1,
                          overlapped=tau > 0)
        return models[0], wan, peak, traffic, clock.total, losses, num_params(models[0]), {"syncs": syncs}

    def _federated(self, spec: RowSpec, b: Budget, progress: ProgressCallback) -> tuple:
        from nebula.quality.evaluate import num_params

        k = b.clients
        models, opts = self._replicas(b, CLUSTERS * k)
        up, down = _Wire(spec.codec), _Wire(spec.codec)  # cluster B's combiner <-> the reducer in A
        clock, losses, rounds, peak = _Clock(), [], 0, 0
        for s in range(b.steps):
            per_client, step_loss = self._local_steps(models, opts, s, b)
            times = [sum(per_client[c * k:(c + 1) * k]) for c in range(CLUSTERS)]  # clients share their cluster
            if (s + 1) % spec.sync_every == 0 or s == b.steps - 1:
                t = time.perf_counter()
                before = up.bytes + down.bytes
                states = [_params(m) for m in models]
                partials = [{n: sum(st[n] for st in states[c * k:(c + 1) * k]) / k for n in states[0]}
                            for c in range(CLUSTERS)]
                partials[1] = {n: up.send(v, n)[0] for n, v in partials[1].items()}
                merged = {n: sum(p[n] for p in partials) / CLUSTERS for n in partials[0]}
                sent = {n: down.send(v, n)[0] for n, v in merged.items()}
                for c, model in enumerate(models):  # cluster A's clients get the reducer's own copy
                    _load(model, merged if c < k else sent)
                peak = max(peak, up.bytes + down.bytes - before)
                rounds += 1
                times = [x + time.perf_counter() - t for x in times]
            clock.step(times)
            losses.append(step_loss)
            progress(s + 1, b.steps)
        wan = up.bytes + down.bytes
        # up, then down: the two transfers are in series, each on its own direction of the link
        traffic = Traffic(exchanges=rounds, bytes_per_exchange=wan / rounds, latencies_per_exchange=2,
                          link_bytes_per_exchange=max(up.bytes, down.bytes) / rounds)
        return models[0], wan, peak, traffic, clock.total, losses, num_params(models[0]), {"rounds": rounds}
