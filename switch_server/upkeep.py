"""The switch's periodic upkeep, once a second while it runs."""
from __future__ import annotations

__all__ = ["CHECKPOINT_EVERY_S", "CRL_POLL_S", "STATUS_EVERY_S", "upkeep"]

import asyncio
import logging
import time
from typing import Any

from switch_server.expiry import upkeep_expiry
from switch_server.lifecycle import reload_crl
from switch_server.memtrim import free_heap_bytes
from switch_server.peers import cut_untrusted

log = logging.getLogger("switch_server.server")

STATUS_EVERY_S = 1.0
CHECKPOINT_EVERY_S = 30.0
CRL_POLL_S = 5.0  # the CRL file is re-read this often, so a revoked live peer is cut well within 60 s


async def upkeep(server: Any) -> None:
    """Every STATUS_EVERY_S: sweeps, grants, metrics, the CRL, expiring certificates (and the warnings of what
    expires: `switch_server.expiry`), audit flushes, checkpoints
    (every CHECKPOINT_EVERY_S, and one owed after a security record), memory trim and the status file of `server`
    (a SwitchServer)."""
    last_cp = time.monotonic()
    last_crl = time.monotonic()
    while True:
        await asyncio.sleep(STATUS_EVERY_S)
        try:
            now = time.monotonic()
            server.local.sweep()
            server.route_grants.refresh()  # (revocations apply also while no worker sends)
            server.metrics.cert_expiry.set(server.trust.cert_not_after - time.time())
            upkeep_expiry(server, time.time())  # (gauges, and a warning line when one enters its margin)
            for c, link in server.links.items():
                server.metrics.queue_bytes.labels(peer=c).set(link.queued_bytes())
            server.metrics.queue_bytes.labels(peer="local").set(server.budget.used)
            if now - last_crl >= CRL_POLL_S:
                last_crl = now
                if server.trust.crl_changed(server.cfg):
                    reload_crl(server)
            cut_untrusted(server)  # (certificates expire while sessions live)
            server.audit_limited.flush()
            for line in server.trust.refusals.due():  # (a peer that stopped dialing: its repeats still summarized)
                log.log(line.level, "%s", line.text)
            # after the flush, so the summary of a flood of refusals is among what the checkpoint covers
            periodic = now - last_cp >= CHECKPOINT_EVERY_S
            if periodic:
                last_cp = now
            server.checkpoints.upkeep(server.links, server.sessions, now, periodic)
            server._trim.maybe(free_heap_bytes(), now)
            server.write_status()
        except Exception:
            log.exception("periodic maintenance failed")
