"""A receiver cluster's hand-off in the one-way mode: each root rank scatters what its sender sent to its k receivers
(itself included) over a process group of their own, and the receivers meet in barriers kept in the job's TCP
store rather than inside gloo collectives (which fail after 30 s when a peer is late: nebula.pipeline.groups)."""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from nebula.pipeline.oneway.plan import ScatterPlan

if TYPE_CHECKING:  # pragma: no cover
    from nebula.pipeline.runner import StageRunner

__all__ = ["Scatter"]

log = logging.getLogger(__name__)


class Scatter:
    """The scatter of one receiver rank; makes the groups of every sender (a collective of all receiver ranks:
    each creates every group, in the same order, one at a time, retried together when gloo fails to connect one)."""

    def __init__(self, r: StageRunner, plan: ScatterPlan, sender_worlds: list[tuple[str, int]], rcv_world: int
                 ) -> None:
        self.r, self.plan = r, plan
        self.group = None
        self._store_sync = None  # StoreBarrier on the job's TCP store, made on first use
        if plan.k > 1:
            from nebula.pipeline.groups import create_groups

            k, num = plan.k, sum(n for _, n in sender_worlds)
            groups = create_groups([list(range(s * k, (s + 1) * k)) for s in range(num)], world=rcv_world,
                                   timeout_s=r.cfg.startup_timeout_s, log=log.warning)
            s = plan.sender_of(r.rank)
            self.group = groups[s] if s is not None else None

    def receive(self, key: tuple[int, int]) -> np.ndarray:
        """This rank's share of micro-batch `key` (step, micro-batch): from the link at a root, else scattered."""
        import paddle.distributed as dist

        r, k = self.r, self.plan.k
        if k == 1:
            return r.prev.recv_array((*key, 0))
        out: list[Any] = []
        t0 = time.perf_counter()
        if r.prev is not None:
            parts = [np.asarray(r.prev.recv_array((*key, j))) for j in range(k)]  # host arrays pickle
            t0 = time.perf_counter()
            self.meet(f"scatter/{r.rank}/{key[0]}/{key[1]}", k)
            dist.scatter_object_list(out, parts, src=r.rank, group=self.group)
        else:
            # wait for the root in the TCP store, not in gloo: the root may wait on the WAN past gloo's 30 s timeout
            self.meet(f"scatter/{r.rank - r.rank % k}/{key[0]}/{key[1]}", k)
            dist.scatter_object_list(out, None, src=r.rank - r.rank % k, group=self.group)
        r.scatter_wait += time.perf_counter() - t0
        return out[0]

    def meet(self, name: str, n: int) -> None:
        """Barrier of `n` receiver ranks kept in the job's TCP store (bounded by peer_timeout_s); with whole-job
        recovery, in the recovery round's fence (a root that lost its sender cluster releases its receivers)."""
        if n < 2:
            return
        recovery = getattr(self.r, "recovery", None)
        if recovery is not None and recovery.fence is not None:
            recovery.fence.meet(f"oneway/{name}", n, timeout_s=self.r.cfg.peer_timeout_s + 60.0)
            return
        if self._store_sync is None:
            from nebula.pipeline.groups import StoreBarrier, job_store

            self._store_sync = StoreBarrier(job_store(), 0, self.r.cfg.peer_timeout_s)
        self._store_sync.wait(f"nebula/oneway/{name}", f"cluster {self.r.cluster}: {name}", world=n)
