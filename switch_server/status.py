"""The switch's status snapshot: links, sessions, queues and throughput, written to `status.json` for
`nebula-switch status`."""
from __future__ import annotations

__all__ = ["STATUS_FILE", "status_path", "switch_status"]

import datetime as dt
import os
import time
from pathlib import Path
from typing import Any

from nebula.config import SwitchConfig
from switch_server.expiry import status_time, watch_of
from switch_server.state import state_dir

STATUS_FILE = "status.json"


def status_path(cfg: SwitchConfig) -> Path:
    """Where a running switch with config `cfg` writes its status."""
    return state_dir(cfg) / STATUS_FILE


def switch_status(server: Any, prev: dict[str, Any]) -> dict[str, Any]:
    """Snapshot of `server` (a SwitchServer); rates are measured since the snapshot `prev`."""
    now = time.time()
    dt_s = max(1e-3, now - prev.get("time", now - 1))
    links = {}
    totals = server.metrics.totals()
    for c, link in server.links.items():
        before = prev.get("links", {}).get(c, {}).get("bytes_out", link.bytes_out)
        links[c] = {
            "address": link.address,
            "up": link.up,
            "peer_epoch": link.peer_epoch,
            "rtt_ms": None if link.rtt_s is None else round(link.rtt_s * 1000, 3),
            "queued_bytes": link.queued_bytes(),
            "unacked_bytes": link.rtx_bytes,
            "bytes_out": link.bytes_out,
            # since the switch started, over every session (a session's own bytes_in restarts with it)
            "bytes_in": totals.get(c, {}).get("bytes_in", 0),
            "frames_out": totals.get(c, {}).get("frames_out", 0),
            "frames_in": totals.get(c, {}).get("frames_in", 0),
            "mbit_out": round((link.bytes_out - before) * 8 / dt_s / 1e6, 3),
            "last_error": link.last_error,
            # accounts the peer asked us to hold back (their ranks there are not connected), and queued bytes per
            # local account: one account's flood waits here while the others' frames go on
            "held_accounts": sorted(p[1] for p in link.lanes.holding() if isinstance(p, tuple)),
            "queued_by_account": {p[1]: n for p, n in link.lanes.by_party().items() if isinstance(p, tuple)},
        }
    sessions = {}
    for c, s in server.sessions.items():
        before = prev.get("sessions", {}).get(c, {}).get("bytes_in", s.bytes_in)
        sessions[c] = {"bytes_in": s.bytes_in, "mbit_in": round((s.bytes_in - before) * 8 / dt_s / 1e6, 3)}
    local = server.local
    watch = watch_of(server)
    expiring = {e.what: e.at for e in watch.refresh(server.cfg, server.trust.cert_not_after)}
    cp = server.checkpoints.last
    return {
        "time": now,
        "started": server.started_at,
        "cluster": server.cfg.cluster,
        "epoch": server.epoch,
        "pid": os.getpid(),
        "wan": server.wan_address,
        "local": local.endpoint,
        "local_ipc": server.cfg.local.ipc_endpoint,
        "metrics": server.metrics_address,
        "workers": len(local.registry),
        # workers whose payloads go through shared memory, and the bytes that did (nebula.wire.shm)
        "shm_workers": sum(1 for r in local.registry if r.shm is not None and r.shm.ready),
        "shm_bytes": dict(server.metrics.shm_bytes),
        "slot_bytes": dict(server.metrics.slot_bytes),  # payloads sent once for many frames (nebula.wire.share)
        "queued_bytes": server.budget.used,
        "links": links,
        "sessions": sessions,
        "certificate_expires": dt.datetime.fromtimestamp(server.trust.cert_not_after, dt.timezone.utc).isoformat(),
        "ca_expires": status_time(expiring["ca"]) if expiring.get("ca") else None,
        "crl_next_update": status_time(expiring["crl"]) if "crl" in expiring else None,
        # one line each for what is within its warning margin or past it: what expires when, and the fix
        "expiry_warnings": watch.warnings(now, server.cfg.cluster, str(server.config_path or "switch.yaml")),
        # our newest signed audit checkpoint (what the peers hold as witnesses of our log)
        "audit_checkpoint": None if cp is None else {"seq": cp.seq, "time": cp.time},
        "reload": dict(server.reloads),  # the last reload's outcome (`nebula-switch reload` waits for it)
        "fatal": server.fatal,
    }
