"""A worker's HELLO on the local side: which credential may join which job as which rank, the start of that rank it
is (its incarnation, given or checked), the stage map its job declares against the account's stage grants, and
the WELCOME that answers it (with a shared-memory arena offer for a same-host worker)."""
from __future__ import annotations

__all__ = ["HelloDesk"]

import logging
import time
from typing import Any, Callable

from nebula.wire import Frame
from switch_server.host import LocalHost
from switch_server.incarnations import Incarnations
from switch_server.localshm import ArenaLedger, WorkerShm
from switch_server.registry import Registration, WorkerRegistry, stage_routes

log = logging.getLogger(__name__)

Refuse = Callable[..., None]  # (ident, code, message)


class HelloDesk:
    """Takes HELLOs: registers (or refuses) the connection, and says what the WELCOME carries."""

    def __init__(self, server: LocalHost, registry: WorkerRegistry, incs: Incarnations, refuse: Refuse,
                 keys: Callable[[], Any], shm_bytes: int, on_release: Callable[[WorkerShm, bool], None]) -> None:
        self.server, self.registry, self.incs, self.refuse = server, registry, incs, refuse
        self.keys = keys  # the accepted worker keys now (hot reload changes them)
        self.shm_bytes = shm_bytes
        self.on_release = on_release
        self.arenas = ArenaLedger(server.budgets.arenas)

    def take(self, frame: Frame, ident: bytes, name: str, account: str
             ) -> tuple[Registration, bool, Registration | None] | None:
        """Register connection `ident` from its HELLO: (its registration, whether it is new, the registration of
        another connection it replaces if any), or None if it was refused (the worker has been told why)."""
        meta = frame.meta
        job, rank = meta["job"], meta["rank"]
        worker = next((w for w in self.keys().values() if w.name == name and w.account == account), None)
        if meta["account"] != account:
            self.refuse(ident, "not_attributed", f"HELLO names account {meta['account']!r} but this key belongs "
                        f"to {account!r}")
            return None
        if worker is None or ("*" not in worker.jobs and job not in worker.jobs):
            self.server.audit(f"worker:{name}", "job_rejected", job, "denied", {"account": account, "rank": rank})
            self.refuse(ident, "job_denied", f"credential {name!r} may not join job {job!r}; allowed: "
                        f"{list(worker.jobs) if worker else []}")
            return None
        addr = (account, job, rank)
        reg = self.registry.get(ident)
        claimed = meta.get("inc", 0)
        if reg is not None and reg.addr == addr:  # the heartbeat of a registered connection
            if claimed not in (0, reg.inc):  # (0: it has not had our WELCOME yet)
                self.refuse(ident, "bad_incarnation", f"HELLO names incarnation {claimed}, but this connection is "
                            f"incarnation {reg.inc} of rank {rank}; one connection is one start of a rank")
                return None
            reg.last_seen = time.monotonic()
            return reg, False, None
        now = time.monotonic()
        if self.registry.held_by_other(addr, ident, now):
            self.refuse(ident, "rank_taken", f"rank {rank} of job {job!r} (account {account!r}) is connected from "
                        "another process; give every process its own rank, or close the other endpoint")
            return None
        if claimed:
            why = self.incs.refusal(addr, claimed)
            if why is not None:
                self.refuse(ident, "bad_incarnation", why)
                return None
        replaced = self.registry.at(addr)
        refused = self._stage_refusal(name, account, job, meta.get("stages"), replaced.ident if replaced else None)
        if refused is not None:
            self.refuse(ident, *refused)
            return None
        inc = claimed or self.incs.assign(addr)
        reg = self.registry.add(ident, account, job, rank, name, inc, meta.get("stages"), self.server.cfg.cluster)
        log.info("worker %s account %s joined job %s as rank %d (incarnation %d)", name, account, job, rank, inc)
        return reg, True, replaced

    def welcome(self, reg: Registration, mapped: Any) -> dict:
        """WELCOME meta for a registered worker: its incarnation, and its arena when it asked for one (HELLO's
        `shm`: the token of the arena it has mapped, 0 for none yet)."""
        welcome = {**self.server.welcome_meta(), "inc": reg.inc}
        if not self.shm_bytes or not isinstance(mapped, int) or isinstance(mapped, bool):
            return welcome
        if reg.shm is None:
            self.arenas.budget = self.server.budgets.arenas  # (a reload may change it)
            try:
                reg.shm = WorkerShm(reg.ident, self.shm_bytes, self.on_release, self.arenas)
            except OSError as exc:
                log.warning("no shared-memory arena for worker %s (%s); its payloads go through the socket", reg.name,
                            exc)
                return welcome
        reg.shm.ready = mapped == reg.shm.arena.token
        return {**welcome, "shm": reg.shm.offer()}

    def _stage_refusal(self, name: str, account: str, job: str, stages: dict[str, str] | None,
                       replaced: bytes | None) -> tuple[str, str] | None:
        """(code, reason) when stage grants are in use and a new registration of (account, job) declares a stage
        map unlike the job's other workers here, or runs a stage here its account holds no grant for."""
        grants = self.server.route_grants
        if not grants.stages_in_use():
            return None
        for other in self.registry.of_job(account, job, but=replaced):
            if other.stages != stages:
                why = (f"job {job!r} of account {account!r} runs here with stage map {other.stages}, but this worker "
                       f"declares {stages}; start every worker of a job from the same job file")
                self.server.audit_limited(("worker_refused", "stage_map_mismatch", account), self.server.actor,
                                          "frame_refused", f"worker:{name}", "denied",
                                          {"reason": "stage_map_mismatch", "detail": why[:300], "account": account,
                                           "job": job})
                return "stage_map_mismatch", why
        here = self.server.cfg.cluster
        own = stage_routes(stages, here).get(here, ())
        why = grants.refusal(account, None, own)
        return None if why is None else self.server.route_refused(account, here, why, own)
