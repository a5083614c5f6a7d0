"""What a run mode adds to the stage runner (`nebula.pipeline.runner.StageRunner`), and the pipeline mode's own.

The runner builds this rank's stages, wires its boundaries, resumes from checkpoints, runs the steps, records
metrics and saves; a mode decides who this rank talks to, how the clusters agree where to start, and what one
step does. `RunHooks` is that interface; `PipelineHooks` is Scenario II (Figure 7): for every micro-batch an
upstream rank runs forward and sends the activation in the background, so the next micro-batch computes while the
previous one is on the link; after the last forward it runs the backwards, each waiting for its gradient. A
downstream rank runs forward and backward per micro-batch as soon as the activation arrives and sends the
gradient back at once. The one-way mode (`nebula.pipeline.oneway`) and cross-cluster data parallelism
(`nebula.dataparallel`) implement the same hooks. See docs/architecture.md, "Run modes".
"""
from __future__ import annotations

from typing import Any

import numpy as np

from nebula.pipeline import checkpoint as ckpt
from nebula.pipeline.cluster_stages import mean_over_ranks
from nebula.pipeline.data import rank_micro_batches, step_ids
from nebula.pipeline.links import Link

__all__ = ["RunHooks", "PipelineHooks", "Wiring", "pad_steps"]

# links of one boundary side: {"act": Link, "grad": Link, "ctl": Link}
Wiring = dict[str, dict[str, Link]]  # "prev" / "next" -> links

_K_STEPS, _K_CHOSEN = (-1, 0, 0), (-2, 0, 0)  # control keys (step field < 0) of the start-up exchange
_PAD = 64  # checkpoint steps exchanged at start-up (the newest)


class RunHooks:
    """A run mode's part of the stage runner; each hook has the runner (`self.r`, a StageRunner) at hand once
    bound. (The runner imports its hooks, not the other way round: hooks reach it through `self.r` only.)"""

    r: Any

    def bind(self, runner: Any) -> None:
        """Called once the stages are built, before any boundary is wired."""
        self.r = runner

    def peer_ranks(self) -> tuple[int | None, int | None]:
        """Rank of the peer on the previous / next boundary (None: no such boundary for this rank)."""
        return None, None

    def channel_wiring(self, prev_rank: int | None, next_rank: int | None) -> Wiring:
        """The links of this rank's boundaries through the switch (the runner's channels by default)."""
        return self.r.channel_wiring(prev_rank, next_rank)

    def wired(self) -> None:
        """Called once the boundaries are up (process groups the mode needs are made here)."""

    def clusters(self) -> list[str]:
        """The clusters taking part in the job (whole-job recovery agrees among them)."""
        return [c for c, _ in self.r.cfg.segments]

    def checkpoint_steps(self) -> list[int]:
        """This cluster's committed, verified checkpoint steps that the mode can resume from."""
        ck = self.r.cfg.checkpoint
        if not ck.dir:
            return []
        return ckpt.local_steps(ck.dir, self.r.cluster, self.r.stages.names)

    def agree(self, steps: list[int]) -> int:
        """The newest checkpoint step every cluster holds (-1: none); also the start barrier."""
        return max(steps) if steps else -1

    def start_step(self) -> int:
        """The first step to train (after loading whatever it resumes from)."""
        return self.r.checkpoint_start()

    def extra_state(self) -> dict[str, np.ndarray] | None:
        """State beyond the stages' that a checkpoint must hold to resume the mode exactly."""
        return None

    def ids(self, step: int, rank: int, world: int) -> list[np.ndarray]:
        """The example ids of each of this rank's micro-batches at `step`."""
        t = self.r.cfg.train
        ids = step_ids(step, seed=t.seed, num_examples=self.r.recipe.num_examples, global_batch=t.global_batch)
        return rank_micro_batches(ids, rank=rank, world_size=world, micro_batches=t.micro_batches)

    def step(self, step: int) -> float | None:
        """One optimizer step of this rank; the loss it reports (None: none)."""
        raise NotImplementedError

    def finish(self) -> None:
        """Called after the last step, before the boundaries close."""

    def abandon(self) -> None:
        """Forget the work of steps a recovery abandoned (the runner then resumes from a checkpoint)."""

    def record_fields(self) -> dict[str, Any]:
        """The mode's fields in this step's metrics record."""
        return {}


class PipelineHooks(RunHooks):
    """Scenario II: stages in model order, rank r of each cluster paired with rank r of the next."""

    def peer_ranks(self) -> tuple[int | None, int | None]:
        r = self.r
        return (r.rank if not r.first_seg else None), (r.rank if not r.last_seg else None)

    def agree(self, steps: list[int]) -> int:
        """Each boundary passes the common steps downstream and the choice back upstream."""
        r, wait = self.r, self.r.cfg.startup_timeout_s
        common = set(steps)
        if r.prev is not None:
            common &= {int(s) for s in r.prev.recv_control(_K_STEPS, wait) if s >= 0}
        if r.next is not None:
            r.next.send_control(_K_STEPS, pad_steps(sorted(common)))
            chosen = int(r.next.recv_control(_K_CHOSEN, wait)[0])
        else:
            chosen = max(common) if common else -1
        if r.prev is not None:
            r.prev.send_control(_K_CHOSEN, np.array([chosen], dtype=np.int64))
        return chosen

    def step(self, step: int) -> float | None:
        from nebula.pipeline.boundary import recv_forward, send_forward

        r = self.r
        mbs = self.ids(step, r.rank, r.world)
        m_count = len(mbs)
        pending = []
        loss_sum = 0.0
        for m, ids in enumerate(mbs):
            received = recv_forward(r.prev, (step, m, 0)) if r.prev is not None else None
            out = r.stages.forward(ids, received)
            token = None
            if r.next is not None:
                if out.send is None:
                    raise RuntimeError(f"stage {r.stages.names[-1]} returned nothing to send to the next stage")
                token = send_forward(out.send, r.next, (step, m, 0), ids)
            total = None
            if out.loss is not None:
                loss_sum += float(out.loss.numpy())
                total = out.loss / m_count
            if token is not None:
                total = token if total is None else total + token
            if r.next is None:
                if total is not None:
                    total.backward()  # downstream end: backward at once, the gradient leaves immediately
            else:
                pending.append(total)
        for total in pending:  # upstream end: backwards in order, each waits for its gradient
            if total is not None:
                total.backward()
        if r.prev is not None:
            r.prev.finish_gradients()
        r.stages.optimizer_step()
        if r.last_seg:
            return mean_over_ranks(loss_sum / m_count, r.world)
        return None


def pad_steps(steps: list[int], pad: int = _PAD) -> np.ndarray:
    """The newest `pad` checkpoint steps as a fixed-size int64 array (-1 fills)."""
    a = np.full(pad, -1, dtype=np.int64)
    v = steps[-pad:]
    a[:len(v)] = v
    return a
