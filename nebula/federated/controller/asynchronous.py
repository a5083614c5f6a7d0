"""The controller's side of asynchronous strategies (FedAsync, FedBuff): every update applied as it comes."""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import numpy as np

from nebula.federated.messages import AsyncUpdate, NewModel, StartAsync
from nebula.federated.controller.trail import RoundRecord

if TYPE_CHECKING:
    from nebula.federated.controller.base import ControllerBase

__all__ = ["run_async", "KEEP_VERSIONS"]

log = logging.getLogger(__name__)
KEEP_VERSIONS = 8  # the last few versions stay at hand for computing deltas


def run_async(ctl: ControllerBase) -> None:
    """Every update is applied as it comes, weighted by its staleness; each new model goes to the combiners
    (once per cluster) and from them to the clients that are idle. Ends after `rounds` model versions."""
    job, mb, trail = ctl.job, ctl.mb, ctl.trail
    head = trail.head()
    weights, state = trail.load(head.version)
    cache = {head.version: weights}
    want = job.clients_per_round or sum(c.num_clients for c in job.clusters)
    live, roster = ctl.wait_roster(job.validity.min_updates, want)
    assignment = ctl.assign(live, roster, head.round + 1)
    for comb, cl in assignment.items():
        mb.send_model(comb, StartAsync(run=ctl.run_id, to=ctl.nonces[comb], round=head.round + 1, version=head.version,
                                       deadline_s=job.deadline_s, clients=tuple(str(p) for p in cl),
                                       config=ctl.strategy.client_options()), weights)
    combiners = sorted(assignment)
    step_clients: list[str] = []
    step_staleness: list[int] = []
    quiet_since = time.monotonic()
    t_step = time.monotonic()
    while head.round < job.rounds and not ctl.stop_requested():
        got = mb.poll(combiners, 1.0)
        if got is None:
            if time.monotonic() - quiet_since > 3 * job.deadline_s:
                raise TimeoutError(f"no update for {3 * job.deadline_s:.0f} s (3 x deadline_s); are the clients "
                                   "running?")
            continue
        peer, u, _ = got
        if not isinstance(u, AsyncUpdate) or u.run != ctl.run_id:
            ctl.discard(peer, u)
            continue
        quiet_since = time.monotonic()
        upd = mb.recv_model(peer, u, job.deadline_s)
        v = u.version
        if not 1 <= v <= head.version:
            log.warning("controller: update of %s from %s names version %s (head is %d); dropped", u.client, peer, v,
                        head.version)
            continue
        base = cache.get(v)
        if base is None:
            base = trail.load(v)[0]
        staleness = head.version - v
        new, state = ctl.strategy.on_update(weights, base, upd, u.num_examples, staleness, state)
        step_clients.append(u.client)
        step_staleness.append(staleness)
        if new is None:
            continue
        bad = next((k for k, w in new.items() if not np.isfinite(w).all()), None)
        if bad is not None:  # finite updates can still overflow together: never commit such a model
            log.warning("controller: the new model's %r holds NaN or Inf; the step of %s is dropped", bad,
                        step_clients)
            ctl.audit.record("fl.step", str(head.round + 1), "invalid", {"why": f"{bad!r} holds NaN or Inf",
                                                                         "clients": step_clients})
            step_clients, step_staleness = [], []
            continue
        version = trail.commit(new, parent=head.version, round=head.round + 1, strategy=ctl.strategy.describe(),
                               clients=step_clients, state=state,
                               metrics={"staleness": step_staleness, "max_staleness": max(step_staleness)})
        trail.record_round(RoundRecord(
            round=head.round + 1, status="valid", version=version, num_updates=len(step_clients),
            num_examples=0, rejected=[], started=time.time(), duration_s=time.monotonic() - t_step,
            detail={"staleness": step_staleness, "mode": "async"}))
        head, weights = trail.get(version), new
        cache[version] = new
        for old in sorted(cache)[:-KEEP_VERSIONS]:
            del cache[old]
        for comb in combiners:
            mb.send_model(comb, NewModel(run=ctl.run_id, to=ctl.nonces[comb], version=version), new)
        log.info("async: version %d from %s (staleness %s)", version, step_clients, step_staleness)
        step_clients, step_staleness, t_step = [], [], time.monotonic()
        ctl.write_status("running", head.round, version)
    ctl.write_status("finished" if head.round >= job.rounds else "stopped", head.round, head.version)
