"""Predicted iteration time of the runner's GPipe schedule (pure arithmetic, no Paddle).

The runner (nebula.hybrid.runner) runs, on every stage k: the forwards of micro-batches 0..M-1 (stage k > 0 waits
for each activation from stage k-1; sends never block the sender), then the backwards in the same order (stage
k < S-1 waits for each gradient from stage k+1), then its replicas all-reduce the gradients, the optimizer steps,
and all ranks all-reduce the step's loss (every stage ends the step together). `gpipe_step_s` replays exactly that
with per-micro-batch times:

    F[i][k] = max(F[i-1][k], F[i][k-1] + link_forward[k-1]) + forward[k]
    B[i][k] = max(B[i-1][k] (F[M-1][k] for i = 0), B[i][k+1] + link_backward[k]) + backward[k]
    step    = max_k (B[M-1][k] + tail[k]) + sync

With equal stages of time t per micro-batch (forward + backward) and free links this is (M + S - 1) x t, GPipe's
fill-and-drain: M micro-batches at the pace of the bottleneck plus S - 1 of bubble.

When the stages' ranks share fewer CPU cores than there are stages (`cores`), the same schedule is replayed event
by event with processor sharing: the ranks computing at a moment split the cores evenly (each at most one), and a
simulated slow rank computes first (`cpu_share` of its measured time, stretched by the sharing) and then sleeps
(1/cpu_share - 1) times that stretched time, as the runner's speed control does; sleeping and waiting ranks leave
their core to the others.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

__all__ = ["StageCost", "gpipe_step_s", "gpipe_bound_s", "link_s", "allreduce_s"]


@dataclass(frozen=True, slots=True)
class StageCost:
    """One stage's seconds: forward and backward per micro-batch, and once per step after the drain (gradient
    all-reduce and optimizer step); link seconds per micro-batch to the next stage (forward and back)."""

    forward_s: float
    backward_s: float
    tail_s: float = 0.0
    link_forward_s: float = 0.0
    link_backward_s: float = 0.0
    cpu_share: float = 1.0  # of forward_s and backward_s, the part computed (1 / simulated slowdown); the rest sleeps


def gpipe_step_s(stages: Sequence[StageCost], micro_batches: int, sync_s: float = 0.0,
                 cores: float = math.inf) -> float:
    """Seconds of one step of the runner's schedule (see the module docstring); `cores` the stages share."""
    s, m = len(stages), micro_batches
    if s < 1 or m < 1:
        raise ValueError(f"gpipe_step_s needs at least one stage and one micro-batch (got {s} and {m})")
    if not cores > 0:
        raise ValueError(f"cores={cores!r} must be > 0 (math.inf: every stage has a core of its own)")
    if cores < s:
        return _shared_step_s(stages, m, cores) + sync_s
    fwd = [[0.0] * s for _ in range(m)]
    for i in range(m):
        for k, st in enumerate(stages):
            ready = fwd[i - 1][k] if i else 0.0
            if k:
                ready = max(ready, fwd[i][k - 1] + stages[k - 1].link_forward_s)
            fwd[i][k] = ready + st.forward_s
    bwd = [[0.0] * s for _ in range(m)]
    for i in range(m):
        for k in range(s - 1, -1, -1):
            ready = bwd[i - 1][k] if i else fwd[m - 1][k]
            if k < s - 1:
                ready = max(ready, bwd[i][k + 1] + stages[k].link_backward_s)
            bwd[i][k] = ready + stages[k].backward_s
    return max(bwd[m - 1][k] + st.tail_s for k, st in enumerate(stages)) + sync_s


def _shared_step_s(stages: Sequence[StageCost], m: int, cores: float) -> float:
    """The schedule replayed event by event with `cores` shared by the computing stages (processor sharing)."""
    s = len(stages)
    tasks = [[("F", i) for i in range(m)] + [("B", i) for i in range(m)] + [("T", 0)] for _ in stages]
    done: dict[tuple[str, int, int], float] = {}
    nxt = [0] * s  # index of each stage's next task
    phase = [""] * s  # "" idle, "cpu" computing, "sleep"
    left = [0.0] * s  # cpu seconds left (at a full core)
    began = [0.0] * s  # when the cpu phase began
    wake = [0.0] * s  # when the sleep ends
    t, eps = 0.0, 1e-12

    def ready_at(k: int) -> float | None:
        """When stage k's next task may start (None: its input is not even sent yet)."""
        kind, i = tasks[k][nxt[k]]
        if kind == "F" and k > 0:
            d = done.get(("F", i, k - 1))
            return None if d is None else d + stages[k - 1].link_forward_s
        if kind == "B" and k < s - 1:
            d = done.get(("B", i, k + 1))
            return None if d is None else d + stages[k].link_backward_s
        return t

    def finish(k: int) -> None:
        kind, i = tasks[k][nxt[k]]
        done[(kind, i, k)] = t
        nxt[k] += 1
        phase[k] = ""

    while any(n < len(ts) for n, ts in zip(nxt, tasks)):
        for k, st in enumerate(stages):  # start every task whose input has arrived
            if not phase[k] and nxt[k] < len(tasks[k]):
                r = ready_at(k)
                if r is not None and r <= t + eps:
                    kind, _ = tasks[k][nxt[k]]
                    work = st.tail_s if kind == "T" else (st.forward_s if kind == "F" else st.backward_s)
                    phase[k], began[k] = "cpu", t
                    left[k] = work if kind == "T" else work * st.cpu_share
        busy = [k for k in range(s) if phase[k] == "cpu"]
        rate = min(1.0, cores / len(busy)) if busy else 1.0
        events = [t + left[k] / rate for k in busy] + [wake[k] for k in range(s) if phase[k] == "sleep"]
        events += [r for k in range(s) if not phase[k] and nxt[k] < len(tasks[k])
                   for r in [ready_at(k)] if r is not None and r > t + eps]
        t_next = min(events)
        for k in busy:
            left[k] -= rate * (t_next - t)
        t = t_next
        for k in range(s):
            if phase[k] == "cpu" and left[k] <= eps:
                kind, _ = tasks[k][nxt[k]]
                slow = 0.0 if kind == "T" else 1.0 / stages[k].cpu_share - 1.0
                if slow > 0:  # the runner sleeps (slowdown - 1) x the compute's wall time
                    phase[k], wake[k] = "sleep", t + slow * (t - began[k])
                else:
                    finish(k)
            elif phase[k] == "sleep" and wake[k] <= t + eps:
                finish(k)
    return t


def gpipe_bound_s(stages: Sequence[StageCost], micro_batches: int) -> float:
    """GPipe's closed form (M + S - 1) x bottleneck (forward + backward per micro-batch), links and tails left out:
    exact for equal stages, an upper bound on `gpipe_step_s` without links and tails otherwise."""
    worst = max(st.forward_s + st.backward_s for st in stages)
    return (micro_batches + len(stages) - 1) * worst


def link_s(nbytes: float, latency_s: float, bandwidth_bytes_per_s: float, messages: int = 1) -> float:
    """Seconds for `messages` messages carrying `nbytes` in all over one link."""
    return messages * latency_s + nbytes / bandwidth_bytes_per_s


def allreduce_s(nbytes: float, ranks: int, latency_s: float, bandwidth_bytes_per_s: float) -> float:
    """Ring all-reduce of `nbytes` over `ranks`: 2(R-1) steps of latency plus 2(R-1)/R of the bytes (0 alone)."""
    if ranks < 2:
        return 0.0
    return 2 * (ranks - 1) * latency_s + 2 * (ranks - 1) / ranks * nbytes / bandwidth_bytes_per_s
