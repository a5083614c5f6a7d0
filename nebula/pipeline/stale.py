"""Stale weights across steps (`train.stale_weights: N`), PipeDream-2BW's delayed update with weight stashing.

In the synchronous schedule (`PipelineHooks`) an upstream cluster cannot start step k+1 before every gradient of
step k is back and its optimizer has stepped, so every step pays at least one WAN round trip plus the pipeline's
fill and drain. With stale weights an upstream rank runs step k+1's forwards at once, sending its activations while
step k's gradients are still on the link, then runs the backwards of step k+1-N (their gradients have arrived
meanwhile) and steps its optimizer. What that computes, exactly: the forwards of step k run on a stash, a copy of the
weights taken when they start, and step k's backwards run on that same stash, so the gradient is consistent with the
forward; it is applied to the weights N steps later:

    w(k+1) = w(k) - update(grad f(stash(k-N)))    for the clusters before the last,

while the last cluster, which computes the loss, steps synchronously. Both sides drain at a checkpoint step and at
the last step (the pending backwards run and the optimizer steps before the step ends), so a checkpoint holds no
pending work and a resumed run computes what the uninterrupted one did. The stash costs one copy of the upstream
stages' parameters per step in flight (N+1). Why N > 1: a step's last gradient comes back one WAN round trip after
the last cluster finishes with it, so with N steps in flight the round trip is shared by N+1 steps.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from nebula.pipeline.hooks import PipelineHooks

__all__ = ["StalePipelineHooks", "WeightStash"]


@dataclass(slots=True)
class _Slot:
    layer: Any
    name: str
    master: Any
    copy: Any


class WeightStash:
    """Copies of a set of layers' parameters, put in the layers' place while forwards run (`swap_in` ...
    `swap_out`), so that autograd records the copies: a later in-place optimizer step on the real parameters does
    not change what the pending backward computes. `move_grads` hands the copies' gradients to the real parameters."""

    def __init__(self, layers: list[Any]) -> None:
        import paddle

        copies: dict[int, Any] = {}  # one copy per parameter object, so tied weights stay tied
        self.slots: list[_Slot] = []
        for top in layers:
            for layer in top.sublayers(include_self=True):
                for name, p in layer._parameters.items():
                    if p is None or p.stop_gradient:
                        continue
                    if id(p) not in copies:
                        with paddle.no_grad():
                            c = p.detach().clone()
                        c.stop_gradient = False
                        copies[id(p)] = c
                    self.slots.append(_Slot(layer, name, p, copies[id(p)]))
        self._unique = {id(s.master): s for s in self.slots}

    def swap_in(self) -> None:
        for s in self.slots:
            s.layer._parameters[s.name] = s.copy

    def swap_out(self) -> None:
        for s in self.slots:
            s.layer._parameters[s.name] = s.master

    def move_grads(self) -> None:
        """Add each copy's gradient to its parameter's (a parameter's own gradient, if any, is kept)."""
        for s in self._unique.values():
            g = s.copy.grad
            if g is None:
                continue
            if s.master.grad is None:
                s.master._set_grad_ivar(g)
            else:
                s.master.grad.add_(g)


@dataclass(slots=True)
class _Pending:
    step: int
    totals: list[Any]
    stash: WeightStash


class StalePipelineHooks(PipelineHooks):
    """The pipeline mode with N-step-stale weights on every cluster but the last (see the module docstring)."""

    def bind(self, runner: Any) -> None:
        super().bind(runner)
        self.delay = int(runner.cfg.train.stale_weights)
        self.pending: deque[_Pending] = deque()

    def step(self, step: int) -> float | None:
        r = self.r
        if r.next is None:  # the last cluster: synchronous, it computes the loss
            return super().step(step)
        from nebula.pipeline.boundary import recv_forward, send_forward

        mbs = self.ids(step, r.rank, r.world)
        stash = WeightStash([s.layer for s in r.stages])
        totals: list[Any] = []
        stash.swap_in()
        try:
            for m, ids in enumerate(mbs):
                received = recv_forward(r.prev, (step, m, 0)) if r.prev is not None else None
                out = r.stages.forward(ids, received)
                if out.send is None:
                    raise RuntimeError(f"stage {r.stages.names[-1]} returned nothing to send to the next stage")
                total = send_forward(out.send, r.next, (step, m, 0), ids)
                if out.loss is not None:  # a stage's own loss before the cut trains with the rest
                    total = total + out.loss / len(mbs)
                totals.append(total)
        finally:
            stash.swap_out()
        self.pending.append(_Pending(step, totals, stash))
        while len(self.pending) > (0 if self._drains_after(step) else self.delay):
            self._apply()  # the oldest step's backwards: its gradients came back while these forwards ran
        return None  # the loss is the last cluster's to report

    def _apply(self) -> None:
        """Run the oldest pending step's backwards (each waits for its gradient) and step the optimizers."""
        p = self.pending.popleft()
        r = self.r
        for total in p.totals:
            if total is not None:
                total.backward()
        if r.prev is not None:
            r.prev.finish_gradients()
        p.stash.move_grads()
        r.stages.optimizer_step()

    def _drains_after(self, step: int) -> bool:
        """A checkpoint (or the end) follows this step: nothing may stay pending across it."""
        cfg, done = self.r.cfg, step + 1
        ck = cfg.checkpoint
        return done == cfg.train.steps or bool(ck.dir and ck.every and done % ck.every == 0)

    def finish(self) -> None:
        while self.pending:
            self._apply()

    def abandon(self) -> None:
        """Forget the pending steps (their graphs hang on the abandoned boundaries); checkpoints hold none."""
        self.pending.clear()
