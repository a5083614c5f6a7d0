"""A switch's start-up binds and its reloads: what an operator sees when a port is taken, a reload is refused, or the
federation revoked the switch's own certificate.

`check_kit` holds the switch's kit to what its admin signed (`security.kit_seal`), before the switch binds and on
every reload: a kit file altered, a peer the admin did not sign, a CRL older than the one signed stop the start
(one line, audited) or refuse the reload. `bind` turns a taken or foreign address into one line naming the config
key, the address and the fix. `reload`
(SIGHUP, `nebula-switch reload`) applies a changed switch.yaml, certificates and CRL without dropping healthy
sessions, or refuses and keeps the running configuration; its outcome is recorded for `nebula-switch reload` to
report. A switch whose own certificate appears in its CRL stops (`own_certificate_revoked`): every peer refuses it.
A stop ends the audit log with `switch_stopped` and a closing checkpoint that `close_audit` hands to every connected
peer before the connections close, so that no record of this run is one that no peer holds a signed head of.
"""
from __future__ import annotations

__all__ = ["CLOSE_WAIT_S", "bind", "bind_error", "check_own_certificate", "close_audit", "reload", "reload_crl"]

import asyncio
import errno
import logging
import socket
import time
from typing import Any, Callable

import zmq

from nebula.config import ConfigError, split_host_port
from nebula.config.budgets import resolve
from nebula.config.switch import SwitchConfig, load_switch_config
from security.kit_seal import KitError, KitState, check_kit as check_kit_files
from switch_server.authz import PeerPolicy
from switch_server.checkpoints import LINK_GAP_S
from switch_server.framestream import write_frame
from switch_server.peers import SwitchError, cut_untrusted, mtime
from switch_server.localtls import open_tls
from switch_server.routegrants import read_policy
from switch_server.tlstransport import Listener

log = logging.getLogger("switch_server.server")

CLOSE_WAIT_S = 4.0  # how long a stop waits for its closing checkpoint to reach the connected peers
_CLOSE_POLL_S = 0.02
SESSION_GRACE_S = 0.3  # a closing checkpoint sent on a peer's session: time for the peer to read it before the abort


def bind_error(key: str, value: str, where: str, exc: BaseException, also: str = "") -> str:
    """One line for an address `value` (config `key`) that cannot be bound: why, and the fix."""
    code = getattr(exc, "errno", None)
    port = value.rpartition(":")[2]
    if code == errno.EADDRINUSE:
        why = (f"address already in use: another process holds port {port} (find it with `ss -ltnp 'sport = "
               f":{port}'`); stop it, or give this switch another port in `{key}`{where}")
    elif code == errno.EADDRNOTAVAIL:
        why = (f"that address is not one of this host's (`ip -brief addr` lists them); put one of them, or "
               f"0.0.0.0, in `{key}`{where}")
    elif code == errno.EACCES:
        why = f"permission denied (ports below 1024 need privileges); use a port above 1023 in `{key}`{where}"
    else:
        why = f"{getattr(exc, 'strerror', None) or exc}; fix `{key}`{where}"
    return f"cannot bind {key} {value}: {why}{' ' + also if also else ''}"


KIT_HIGH_WATER = "kit_high_water.json"  # in the state directory: the highest kit revision and CRL number run here


def check_kit(cfg: SwitchConfig, config_path: Any, state: Any = None) -> KitState | None:
    """The admin's signed state of the kit `config_path` lies in, if it is one; SwitchError naming the file. With
    the switch's `state` (a SwitchState), a kit below the revision or CRL number this switch already ran with is
    refused (a site that put back an older signed update, or the kit's original files, rolls back nothing), and the
    high-water mark rises to this kit's."""
    if config_path is None:
        return None
    try:
        kit = check_kit_files(config_path, federation=cfg.federation, cluster=cfg.cluster, ca_path=cfg.tls.ca,
                              crl_path=cfg.tls.crl, peers=[p.cluster for p in cfg.peers])
    except KitError as exc:
        raise SwitchError(str(exc)) from None
    if state is not None:
        hold_high_water(state, kit, str(config_path))
    return kit


def hold_high_water(state: Any, kit: KitState, where: str) -> None:
    """Refuse `kit` below the revision or CRL number recorded in `state`; record the higher of the two."""
    seen = state.read_json(KIT_HIGH_WATER, {}) or {}
    mark = state.dir / KIT_HIGH_WATER
    for key, now in (("revision", kit.revision), ("crl_number", kit.crl_number)):
        was = seen.get(key) if isinstance(seen, dict) else None
        if isinstance(was, int) and not isinstance(was, bool) and now < was:
            raise SwitchError(f"the kit of {where} is at {key.replace('_', ' ')} {now}, but this switch already ran "
                              f"with {was} ({mark}): the kit was rolled back; apply the admin's latest update "
                              f"(nebula-switch reload --update), or, if the admin provisioned this site anew, remove "
                              f"{mark}")
    high = {"revision": kit.revision, "crl_number": kit.crl_number}
    if isinstance(seen, dict):
        high = {k: max(v, seen[k]) if isinstance(seen.get(k), int) else v for k, v in high.items()}
    if high != seen:
        state.write_json(KIT_HIGH_WATER, high)


def _kit_detail(kit: KitState) -> dict[str, Any]:
    return {"revision": kit.revision, "crl_number": kit.crl_number, "signer": kit.signer, "source": kit.source}


async def bind(server: Any, on_conn: Callable[[socket.socket, Any], None]) -> tuple[str, str]:
    """Check the kit, then bind the metrics endpoint, the local side and the WAN listener of `server` (whose
    connections go to `on_conn`); (local endpoint, WAN address)."""
    cfg = server.cfg
    kit = check_kit(cfg, server.config_path, server.state)
    if kit is not None:
        server.audit(server.actor, "kit_verified", str(server.config_path), "ok", _kit_detail(kit))
    where = f" of {server.config_path}" if server.config_path else ""
    if cfg.metrics.listen:
        host, port = split_host_port(cfg.metrics.listen, "metrics.listen")
        try:
            mhost, mport = server.metrics.serve(host, port)
        except OSError as exc:
            raise SwitchError(bind_error("metrics.listen", cfg.metrics.listen, where, exc)) from None
        server.metrics_address = f"{mhost}:{mport}"
    try:
        local_endpoint = await server.local.start()
    except zmq.ZMQError as exc:
        raise SwitchError(bind_error("local.endpoint", cfg.local.endpoint, where, exc,
                                     "(and `endpoint` in its workers' worker.yaml)")) from None
    except OSError as exc:  # (the IPC endpoint: its message names the key and the fix)
        raise SwitchError(str(exc)) from None
    if cfg.local.tls_endpoint:
        try:
            server.local_tls = open_tls(server.local, server.local.streams)
        except OSError as exc:
            raise SwitchError(bind_error("local.tls_endpoint", cfg.local.tls_endpoint, where, exc,
                                         "(and `tls_endpoint` in its workers' worker.yaml)")) from None
    host, port = split_host_port(cfg.listen, "listen")
    try:
        server.wan_server = Listener(host, port, on_conn)
    except OSError as exc:
        raise SwitchError(bind_error("listen", cfg.listen, where, exc,
                                     "(and tell its peers: their peers[].address)")) from None
    bound_host, bound_port = server.wan_server.address()
    return local_endpoint, f"{bound_host}:{bound_port}"


def _outcome(server: Any, outcome: str, detail: dict[str, Any]) -> None:
    """Record a reload's outcome (audit, status for `nebula-switch reload`)."""
    server.reloads = {"count": server.reloads.get("count", 0) + 1, "time": time.time(), "outcome": outcome, **detail}
    server.audit(server.actor, "reload", str(server.config_path), outcome, detail)
    if server.started:
        server.write_status()


def reload(server: Any) -> bool:
    """Re-read `server`'s config file, certificates, CRL, routes and limits without dropping healthy sessions."""
    try:
        if server.config_path is None:
            raise ConfigError("no config file to reload")
        new = load_switch_config(server.config_path)
        if (new.cluster, new.federation) != (server.cfg.cluster, server.cfg.federation):
            raise ConfigError("cluster and federation cannot change on reload; restart the switch")
        read_policy(new.accounts_home)  # an unreadable accounts_home refuses the reload before anything changes
        kit = check_kit(new, server.config_path, server.state)  # an altered or rolled-back kit is refused
        server.trust.load(new)  # (unchanged if it raises)
        server.route_grants.set_home(new.accounts_home)
        server.cfg = new
    except (ConfigError, SwitchError) as exc:
        log.error("reload refused, keeping the running configuration: %s", exc)
        _outcome(server, "error", {"reason": str(exc)[:300]})
        return False
    server.set_budgets(resolve(new))
    server.policy = PeerPolicy(new)
    new_peers = {p.cluster: p for p in new.peers}
    for cluster in list(server.links):
        if cluster not in new_peers:
            link = server.links.pop(cluster)
            asyncio.ensure_future(link.stop())
            s = server.sessions.get(cluster)
            if s is not None:
                s.close("peer removed from the route table")
        elif new_peers[cluster].address != server.links[cluster].address:
            server.links[cluster].address = new_peers[cluster].address
            server.links[cluster].drop_session("peer address changed")
    for cluster, peer in new_peers.items():
        if cluster not in server.links:
            server.add_link(peer)
    for link in server.links.values():
        link.set_limits()
    for bucket in server.account_buckets.values():
        bucket.set_rate(new.limits.account_rate_mbit)
    server.local.set_workers(new.local.workers)
    cut_untrusted(server)
    _outcome(server, "ok", {"peers": sorted(new_peers), "revoked": len(server.trust.revoked),
                            **({"kit": _kit_detail(kit)} if kit is not None else {})})
    server.link_changed()
    check_own_certificate(server)
    return True


def reload_crl(server: Any) -> None:
    """The CRL file changed: use it (or keep the previous one if it cannot be used), cut what it revokes."""
    cfg = server.cfg
    try:
        server.trust.load(cfg)
    except SwitchError as exc:
        log.error("CRL changed but cannot be used, keeping the previous one: %s", exc)
        server.audit(server.actor, "crl_reload", cfg.tls.crl, "error", {"reason": str(exc)[:300]})
        server.trust.crl_mtime = mtime(cfg.tls.crl)  # (tried again when the file changes again)
        return
    server.audit(server.actor, "crl_reload", cfg.tls.crl, "ok", {"revoked": len(server.trust.revoked)})
    cut_untrusted(server)
    check_own_certificate(server)


def check_own_certificate(server: Any) -> bool:
    """Whether `server` may go on serving: not when its CRL revokes its own certificate (the federation removed
    its cluster, or the key was compromised). Then it says so once, audits it, and asks to stop (exit code 3)."""
    serial = server.trust.own_serial
    if serial not in server.trust.revoked or server.fatal is not None:
        return server.fatal is None
    cfg = server.cfg
    server.fatal = (f"switch {cfg.cluster} stops: its own certificate {cfg.tls.cert} (serial {serial:x}) is "
                    f"revoked in the CRL {cfg.tls.crl}, so every peer refuses it; if cluster {cfg.cluster} is to "
                    "stay in the federation, ask its admin for a new kit (`nebula-admin provision add-cluster`)")
    log.error("%s", server.fatal)
    server.audit(server.actor, "own_certificate_revoked", cfg.cluster, "denied",
                 {"serial": f"{serial:x}", "crl": cfg.tls.crl})
    server.must_stop.set()
    return False


async def close_audit(server: Any) -> list[str]:
    """A stop's closing checkpoint: record `switch_stopped`, sign the head, hand the checkpoint to every connected
    peer (on our link to it, else on its session to us) and wait until each has it, at most CLOSE_WAIT_S; the peers
    that have it. A peer takes one checkpoint per connection per second and keeps one of ours per second, so each
    send waits until LINK_GAP_S after the last one that peer saw; a link's send counts once the peer answered it
    (it keeps ours before it answers), a session's once our side handed it to the network and SESSION_GRACE_S
    passed (the peer's link does not answer). Should a record still come after it (a session's last words), the
    new head is signed and sent again while time is left."""
    ex = server.checkpoints
    for link in list(server.links.values()):
        if not (link.up and link.writer is not None):
            await link.stop()  # (a link that came up now would be recorded after the closing checkpoint)
    peers = sorted({c for c, link in server.links.items() if link.up and link.writer is not None}
                   | {c for c, s in server.sessions.items() if not s.closed})
    server.audit_limited.flush(force=True)  # refusals counted but not yet written: before the closing record
    server.audit(server.actor, "switch_stopped", server.wan_address, "ok", {"peers": peers})
    ex.closing = True  # (peers' answers are kept beside the log: the closing checkpoint stays its last record)
    if ex.log is None or not peers:
        return []
    deadline = time.monotonic() + CLOSE_WAIT_S
    head, frame = -1, b""
    sent: dict[str, float] = {}  # peer -> when the current head was sent to it
    last: dict[str, float] = {}  # peer -> when any head was sent to it (pacing a second one)
    held: set[str] = set()
    while time.monotonic() < deadline:
        if ex.log.seq != head:  # (first, or a record came after the checkpoint sent)
            frame = ex.frame()
            if frame is None:
                return []
            head, sent, held = ex.log.seq, {}, set()
        now = time.monotonic()
        live = 0  # connected peers that do not have it yet
        for c in peers:
            link, s = server.links.get(c), server.sessions.get(c)
            on_link = link is not None and link.up and link.writer is not None
            if c in held or not (on_link or (s is not None and not s.closed)):
                continue
            live += 1
            if c in sent:
                if link is not None and link.last_checkpoint >= sent[c] or (
                        not on_link and now - sent[c] >= SESSION_GRACE_S
                        and s.writer.transport.get_write_buffer_size() == 0):
                    held.add(c)
                    live -= 1
                continue
            ready = max(ex.next_send(link) if link is not None else 0.0,
                        (s.last_checkpoint + LINK_GAP_S) if s is not None else 0.0,
                        last.get(c, float("-inf")) + LINK_GAP_S)
            if now >= ready:
                write_frame(link.writer if on_link else s.writer, frame)
                sent[c] = last[c] = now
        if not live:  # every connected peer has it (or none is left)
            break
        await asyncio.sleep(_CLOSE_POLL_S)
    missed = [c for c in peers if c not in held]
    if missed:
        log.warning("closing audit checkpoint not confirmed by %s within %g s; `nebula-admin audit verify` finds "
                    "this log's last records unwitnessed until the switch runs again beside a peer",
                    ", ".join(missed), CLOSE_WAIT_S)
    return sorted(held)
