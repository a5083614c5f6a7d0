"""Whole-job recovery on the stage runner (docs/recovery.md, "How the runtime calls it").

A cluster's ranks share every decision of the recovery through the job's TCP store (Paddle's, which
`paddle.distributed.launch` gives each cluster), never through a gloo collective, which a rank stuck on the WAN
would leave its siblings waiting in:

- `ClusterFence`: meetings of the cluster's ranks kept in the store, per recovery round. A rank that lost its peer
  cluster gives the round up; every rank waiting at a meeting of that round (the vote before the gradients'
  all-reduce, a one-way scatter, a data-parallel sync) then stops with `StepAbandoned` instead of entering a
  collective its sibling will never join, and all of them meet again at the recovery.
- `RankRecovery`: rank 0 runs the cluster's `nebula.recovery.Coordinator` (the agreement with the other clusters,
  through the switches) and publishes what it decided: the step to start from, whether to pause at this boundary,
  the step to resume from and the round's tag, which names the boundary channels of the round.

A cluster of one rank needs no store: its one rank decides alone.
"""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any, Sequence

from nebula.pipeline.links import PeerLost
from nebula.pipeline.metrics import MetricsWriter

__all__ = ["StepAbandoned", "PauseRequested", "ClusterFence", "RankRecovery"]

log = logging.getLogger(__name__)

_POLL_S = (0.001, 0.02)  # a meeting's poll starts fast and backs off to this


class StepAbandoned(RuntimeError):
    """Another rank of this cluster gave up the current step (its peer cluster was lost): drop it and recover."""


class PauseRequested(RuntimeError):
    """Another cluster began a recovery: this cluster stops at its step boundary and takes part."""


class ClusterFence:
    """Meetings of a cluster's `world` ranks in the job's TCP store (`add` counters), per recovery round."""

    def __init__(self, store: Any, world: int, timeout_s: float, cluster: str) -> None:
        self.store, self.world, self.timeout_s, self.cluster = store, world, timeout_s, cluster
        self.round = 0
        self._votes = 0  # votes before the gradients' all-reduce in this round

    def _key(self, name: str) -> str:
        return f"nebula/recovery/{self.round}/{name}"

    def give_up(self) -> None:
        """This rank stops the round (its peer cluster was lost): every meeting of the round lets its ranks go."""
        self.store.add(self._key("failed"), 1)

    def given_up(self) -> bool:
        return self.store.add(self._key("failed"), 0) > 0

    def meet(self, name: str, n: int | None = None, *, abort: bool = True, timeout_s: float | None = None) -> None:
        """Count this rank in at meeting `name` of the round and wait for `n` ranks (default: all); StepAbandoned
        as soon as the round was given up (unless `abort` is False)."""
        n, key = n or self.world, self._key(name)
        limit = self.timeout_s if timeout_s is None else timeout_s
        self.store.add(key, 1)
        deadline, nap = time.monotonic() + limit, _POLL_S[0]
        while (have := self.store.add(key, 0)) < n:
            if abort and self.given_up():
                raise StepAbandoned(f"cluster {self.cluster}: another rank gave up this step (its peer cluster was "
                                    "lost); the step is dropped")
            if time.monotonic() > deadline:
                raise RuntimeError(f"cluster {self.cluster}: only {have} of {n} ranks reached {name!r} of recovery "
                                   f"round {self.round} within {limit:.0f} s; a rank is stuck or died (see its log)")
            time.sleep(nap)
            nap = min(nap * 2, _POLL_S[1])

    def vote(self) -> None:
        """Before the gradients' all-reduce: every rank got its step's data (else StepAbandoned, and nobody enters
        the all-reduce)."""
        self._votes += 1
        self.meet(f"reduce/{self._votes}")

    def publish(self, name: str, doc: dict) -> None:
        """Rank 0 tells the other ranks `doc` (JSON) under `name` of this round."""
        self.store.set(self._key(name), json.dumps(doc).encode())
        self.store.add(self._key(f"{name}/set"), 1)

    def receive(self, name: str, timeout_s: float) -> dict:
        """What rank 0 published under `name` of this round, waiting up to `timeout_s`."""
        deadline, nap = time.monotonic() + timeout_s, _POLL_S[0]
        while self.store.add(self._key(f"{name}/set"), 0) < 1:
            if time.monotonic() > deadline:
                raise RuntimeError(f"cluster {self.cluster}: rank 0 published no {name!r} in recovery round "
                                   f"{self.round} within {timeout_s:.0f} s (see rank 0's log)")
            time.sleep(nap)
            nap = min(nap * 2, _POLL_S[1])
        return json.loads(bytes(self.store.get(self._key(name))).decode())

    def next_round(self) -> None:
        self.round += 1
        self._votes = 0


class RankRecovery:
    """One rank's part in whole-job recovery: the agreement at start, the pause check at every step boundary, and
    the recovery after a lost peer cluster or a requested pause."""

    def __init__(self, runner: Any, clusters: Sequence[str]) -> None:
        from nebula.recovery.driver import Coordinator

        cfg = runner.cfg
        self.r, self.cluster, self.rank = runner, runner.cluster, runner.rank
        self.recovery_timeout_s = cfg.recovery_timeout_s
        # siblings reach a meeting within a peer timeout (they wait on their own peers), the decisions within the
        # agreement's bound (restarted whenever a lost cluster comes back): generous bounds, a stuck rank still ends
        self.meet_s = 2 * cfg.peer_timeout_s + 60.0
        self.decide_s = 4 * max(cfg.recovery_timeout_s, cfg.startup_timeout_s) + 60.0
        self.fence: ClusterFence | None = None
        if runner.world > 1:
            from nebula.pipeline.groups import job_store

            self.fence = ClusterFence(job_store(), runner.world, self.meet_s, runner.cluster)
        self.coord = None
        if self.rank == 0:
            self.coord = Coordinator(runner.connect(), job=cfg.job, clusters=list(clusters),
                                     timeout_s=cfg.recovery_timeout_s,
                                     state_dir=Path(cfg.checkpoint.dir) / "recovery")
        self.tag = ""  # the agreed round's tag: names the boundary channels
        self.recoveries = 0
        # one line per agreement in <metrics.dir>/recovery/<cluster>.rank<r>.jsonl (benchmarks and tests)
        self._events = MetricsWriter(str(Path(cfg.metrics.dir) / "recovery") if cfg.metrics.dir else None,
                                     runner.cluster, runner.rank)

    # ---- decisions --------------------------------------------------------------------------------------------
    def start(self, steps: Sequence[int]) -> int:
        """At launch: the step every cluster starts from (-1: none), agreed with the other clusters."""
        t0 = time.monotonic()
        decision = self._decide("start", lambda: self.coord.start(steps, timeout_s=self.r.cfg.startup_timeout_s))
        self._event("started", decision, t0)
        return decision["step"]

    def pause_at(self, step: int) -> bool:
        """At the boundary before `step`: whether another cluster began a recovery (the same answer on every rank)."""
        pause = bool(self.coord.pause_requested()) if self.coord is not None else False
        if self.fence is None:
            return pause
        key = self.fence._key(f"pause/{step}")
        if self.rank == 0:
            self.fence.store.add(key, 2 if pause else 1)
            return pause
        deadline, nap = time.monotonic() + self.meet_s, _POLL_S[0]
        while (v := self.fence.store.add(key, 0)) == 0:
            if time.monotonic() > deadline:
                raise RuntimeError(f"cluster {self.cluster}: rank 0 did not reach the boundary before step {step} "
                                   f"within {self.meet_s:.0f} s")
            time.sleep(nap)
            nap = min(nap * 2, _POLL_S[1])
        return v == 2

    def recover(self, step: int, cause: BaseException, steps: Any) -> int:
        """Stopped in (or after) `step` because of `cause`: drop the partial step, meet the cluster's other ranks,
        agree with the other clusters (rank 0) and return the step every cluster resumes from (-1: from
        scratch). `steps()` lists this cluster's verified checkpoints (called on rank 0 only)."""
        t0 = time.monotonic()
        lost = (cause.cluster,) if isinstance(cause, PeerLost) else ()
        log.warning("cluster %s rank %d: stopping at step %d for recovery (%s)", self.cluster, self.rank, step,
                    str(cause).splitlines()[0][:300] if str(cause) else type(cause).__name__)
        self.r.stages.clear_grad()
        if self.fence is not None:
            if not isinstance(cause, PauseRequested):
                self.fence.give_up()
            self.fence.meet("recover", abort=False, timeout_s=self.meet_s)
        decision = self._decide("resume", lambda: self.coord.recover(steps(), lost=lost))
        self.recoveries += 1
        self._event("recovered", decision, t0, stopped=step, lost=list(lost), cause=type(cause).__name__)
        if self.fence is not None:
            self.fence.next_round()
        return decision["step"]

    def _decide(self, name: str, agree: Any) -> dict:
        """Rank 0 runs `agree` (the coordinator) and publishes the outcome; the other ranks wait for it. A recovery
        given up or superseded on rank 0 is raised on every rank."""
        from nebula.recovery.driver import RecoveryAbandoned, RecoverySuperseded

        if self.coord is not None:
            try:
                step = agree()
            except RecoveryAbandoned as exc:
                self._tell(name, {"abandoned": str(exc), "cluster": exc.cluster})
                raise
            except RecoverySuperseded as exc:
                self._tell(name, {"superseded": str(exc)})
                raise
            except BaseException as exc:
                self._tell(name, {"failed": f"{type(exc).__name__}: {exc}"})
                raise
            doc = {"step": step, "epoch": self.coord.round.epoch, "tag": self.coord.round.tag}
            self._tell(name, doc)
        else:
            doc = self.fence.receive(name, self.decide_s)
        if "abandoned" in doc:
            raise RecoveryAbandoned(doc["cluster"], doc["abandoned"])
        if "superseded" in doc:
            raise RecoverySuperseded(doc["superseded"])
        if "failed" in doc:
            raise RuntimeError(f"cluster {self.cluster}: rank 0 failed in the recovery: {doc['failed']}")
        self.tag = doc["tag"]
        return doc

    def _tell(self, name: str, doc: dict) -> None:
        if self.fence is not None:
            self.fence.publish(name, doc)

    def _event(self, what: str, decision: dict, t0: float, **extra: Any) -> None:
        """One line per agreement (the recovery events file)."""
        self._events.write({"event": what, "cluster": self.cluster, "rank": self.rank, "step": decision["step"],
                            "epoch": decision["epoch"], "tag": decision["tag"],
                            "wait_s": round(time.monotonic() - t0, 3), "time": time.time(),
                            "launch": self.coord.incarnation.count if self.coord is not None else None, **extra})

    def close(self) -> None:
        self._events.close()
