"""Cluster-private side: a ZeroMQ ROUTER for the cluster's workers; registration (HELLO) and delivery to them.

Workers on other hosts of the cluster connect over TCP with CURVE. Workers on the switch's own host may use the
optional IPC endpoint instead: the kernel carries those bytes, so they skip CURVE's encryption, and the worker
authenticates with ZeroMQ PLAIN (`switch_server.zap`). Both endpoints belong to one socket, so routing is the same.
Such a worker may also take a shared-memory arena for its payloads (`switch_server.localshm`, `local.shm_bytes`).
"""
from __future__ import annotations

__all__ = ["LocalSide", "bind_endpoint"]

import asyncio
import logging
import time
from typing import Any, Callable

import zmq
import zmq.asyncio

from nebula.config import LocalConfig
from nebula.wire import (HEADER_BYTES, MAX_META_BYTES, ChannelKey, Dispatcher, Frame, FrameType, Lane, WireError,
                         decode_frame,
                         decode_head)
from nebula.wire.shm import SHM_TAG
from switch_server.answers import AnswerLimiter
from switch_server.budget import Party
from switch_server.delivery import Delivery, Source
from switch_server.host import LocalHost, Origin
from switch_server.hello import HelloDesk
from switch_server.incarnations import Incarnations
from switch_server.localshm import ShmReleases, WorkerShm
from switch_server.localwatch import ConnectionWatch
from switch_server.registry import Registration, Registry
from switch_server.zap import ZAP_DOMAIN, ZapHandler

log = logging.getLogger(__name__)

SNDHWM = 8  # frames queued per worker inside ZeroMQ; the rest waits in our lane queues so priorities hold
# worker frames handled per wake-up: small, so a frame for a higher lane waits behind few bulk frames before the
# link writer runs
PUMP_BATCH = 16
SILENT_S = 120.0  # a registration with no frame for this long is forgotten
# refusals audited: a worker trying to speak for another account, job, rank or start of its rank, or acknowledging
# what was never sent to it
AUDITED_REFUSALS = frozenset({"not_attributed", "bad_incarnation", "ack_beyond_sent", "too_many_channels"})


def bind_endpoint(endpoint: str) -> str:
    """ZeroMQ bind form of `endpoint`: a port of 0 means any free port."""
    if endpoint.startswith("tcp://") and endpoint.endswith(":0"):
        return endpoint[:-2] + ":*"
    return endpoint


class LocalSide:
    """ROUTER socket for the cluster's workers; attributes every frame to an account and a job."""

    def __init__(self, server: LocalHost, cfg: LocalConfig, public_key: bytes, secret_key: bytes,
                 incs: Incarnations) -> None:
        self.server = server
        self.cfg = cfg
        self.ctx = zmq.asyncio.Context()
        self.public_key = public_key
        self.secret_key = secret_key
        self.zap = ZapHandler(secret_key, server.metrics, server.audit)
        self.zap.set_workers(cfg.workers)
        self.registry = Registry()
        self.answers = AnswerLimiter()
        self.delivery = Delivery(server, self._ready_shm, self._forget, self.kick)
        self.send_control = self.delivery.send_control
        self.flush = self.delivery.flush
        self.endpoint = ""
        self.router: zmq.asyncio.Socket | None = None
        self.sync: zmq.Socket | None = None
        self.watch: ConnectionWatch | None = None
        self.tasks: list[asyncio.Task] = []
        self.held = False  # over the memory cap: workers are held back by ZeroMQ's own limits
        self.throttled = False
        self._kicked = False
        self.shm_releases = ShmReleases(lambda ident, meta: self.send_control(ident, FrameType.SHM_RELEASE, meta))
        self.desk = HelloDesk(server, self.registry, incs, self.refuse, lambda: self.zap.keys, cfg.shm_bytes,
                              self.shm_releases.released)
        self.on_frame = Dispatcher("the local side (workers may send HELLO, BYE, DATA, ACK and SHM_RELEASE)", {
            FrameType.HELLO: self._on_hello,
            FrameType.BYE: self._on_bye,
            FrameType.SHM_RELEASE: self._on_shm_release,
            FrameType.DATA: self._on_routed,
            FrameType.ACK: self._on_routed,
        })

    def set_workers(self, workers: tuple) -> None:
        """Replace the accepted worker keys (hot reload)."""
        self.zap.set_workers(workers)

    async def start(self) -> str:
        """Bind the ZAP handler and the ROUTER; return the bound endpoint."""
        self.zap.bind(self.ctx)
        r = self.router = self.ctx.socket(zmq.ROUTER)
        r.linger = 0
        r.curve_server = True
        r.curve_publickey = self.public_key
        r.curve_secretkey = self.secret_key
        r.zap_domain = ZAP_DOMAIN
        r.setsockopt(zmq.ROUTER_MANDATORY, 1)
        r.sndhwm = SNDHWM
        r.rcvhwm = 16  # frames waiting here are FIFO: keep few, so priorities act in our lanes instead
        # a far larger message part ends the connection before it is read into memory (a frame is a head of at
        # most HEADER_BYTES + MAX_META_BYTES and a payload of at most one chunk; up to twice that, it is read and
        # refused with chunk_too_large, which names the fix)
        r.maxmsgsize = 2 * self.server.cfg.link.chunk_bytes + HEADER_BYTES + MAX_META_BYTES
        r.bind(bind_endpoint(self.cfg.endpoint))
        self.endpoint = r.getsockopt_string(zmq.LAST_ENDPOINT)  # (the TCP one, with the port a port of 0 got)
        if self.cfg.ipc_endpoint:
            # listeners copy the socket's options when they bind: this one speaks PLAIN, the TCP one CURVE
            r.curve_server = False
            r.plain_server = True
            try:
                r.bind(self.cfg.ipc_endpoint)
            except zmq.ZMQError as exc:
                raise OSError(f"cannot bind local.ipc_endpoint {self.cfg.ipc_endpoint}: {exc}; is another switch "
                              "using it? pick another name, or leave it out") from None
        # a synchronous view of the same socket: non-blocking sends and batched receives without futures
        self.sync = self.delivery.sock = zmq.Socket.shadow(r.underlying)
        self.watch = ConnectionWatch(r, self._dropped_by_zmq)
        self.zap.before_reply = self.watch.drain
        asyncio.get_running_loop().add_reader(self.sync.FD, self._pump)  # at once: a readable edge costs no extra loop turn
        self.tasks = [asyncio.create_task(self.zap.serve()), asyncio.create_task(self._safety_kick())]
        self.kick()
        return self.endpoint

    async def stop(self) -> None:
        """Close sockets and stop tasks."""
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.watch is not None:
            self.zap.before_reply = None
            self.watch.close()
            self.watch = None
        if self.sync is not None:
            asyncio.get_running_loop().remove_reader(self.sync.FD)
            self.sync = self.delivery.sock = None
        if self.router is not None:
            self.router.close(0)
        self.zap.close()
        self.ctx.destroy(linger=0)  # closes anything still open instead of waiting for it

    # ---- receiving ----
    # ZeroMQ's FD only signals edges, and any send may consume one: so every send and every wake-up re-checks
    # EVENTS, and the pump drains until the socket says it has nothing more.
    def kick(self) -> None:
        """Schedule a look at the socket (after a send, a resume, or a readable edge)."""
        if not self._kicked:
            self._kicked = True
            asyncio.get_running_loop().call_soon(self._pump)

    def _pump(self) -> None:
        self._kicked = False
        sock = self.sync
        if sock is None or self.held or self.throttled:
            return
        for _ in range(PUMP_BATCH):  # then yield, so links and timers run between batches
            if not sock.get(zmq.EVENTS) & zmq.POLLIN:
                return
            try:
                parts = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            try:
                self._on_message(parts)
            except Exception:
                log.exception("failed to handle a worker frame")
            if self.held or self.throttled:
                return
        self.kick()

    async def _safety_kick(self) -> None:
        while True:
            await asyncio.sleep(0.1)
            self.kick()
            if self.watch is not None:
                self.watch.drain()

    def _unthrottle(self) -> None:
        self.throttled = False
        self.kick()

    def _on_message(self, parts: list[zmq.Frame]) -> None:
        ident = parts[0].bytes
        if len(parts) == 4 and parts[2].bytes == SHM_TAG:
            try:
                payload = self._shm_payload(ident, parts[3].buffer)
            except WireError as exc:
                try:  # name the channel when the head is sound, so the sender's message fails rather than waits
                    h, meta = decode_head(parts[1].buffer)
                    frame = Frame(h, meta) if h.type == FrameType.DATA else None
                except WireError:
                    frame = None
                self.refuse(ident, exc.code, exc.message, frame)
                return
            if payload is None:
                return
        elif len(parts) in (2, 3):
            payload = parts[2].buffer if len(parts) == 3 else b""
        else:
            self.refuse(ident, "bad_parts", f"expected head and payload (or head, {SHM_TAG.decode()} and a shared-memory "
                        f"descriptor) after the identity, got {len(parts) - 1} parts")
            return
        head = parts[1]
        name, _, account = head.get("User-Id").partition("/")
        try:
            frame = decode_frame(head.buffer, payload, max_payload_bytes=self.server.cfg.link.chunk_bytes)
        except WireError as exc:
            self.refuse(ident, exc.code, f"malformed frame: {exc.message}")
            return
        try:
            self.on_frame(frame, ident, name, account, head, payload)
        except WireError as exc:
            self.refuse(ident, exc.code, exc.message, frame)

    def _registered(self, ident: bytes, frame: Frame) -> Registration | None:
        reg = self.registry.get(ident)
        if reg is None:
            self.refuse(ident, "no_hello", "send HELLO (job, rank) before any other frame", frame)
            return None
        reg.last_seen = time.monotonic()
        return reg

    def _on_bye(self, _frame: Frame, ident: bytes, *_: Any) -> None:
        reg = self.registry.get(ident)
        if reg is None and not self._may_answer(ident, "bye"):
            return
        self.delivery.say_bye(ident)
        if reg is not None:
            self._forget(ident)
            self.server.incarnation_ended(reg.account, reg.job, reg.rank, reg.inc)

    def _on_shm_release(self, frame: Frame, ident: bytes, *_: Any) -> None:
        reg = self._registered(ident, frame)
        if reg is not None and reg.shm is not None and frame.meta["token"] == reg.shm.arena.token:
            for off in frame.meta["offsets"]:
                reg.shm.down.free(off)  # (an unknown offset is a stale release: nothing to free)

    def _on_routed(self, frame: Frame, ident: bytes, _name: str, _account: str, head: zmq.Frame, payload: Any) -> None:
        """A worker's DATA or ACK: attributed to its registration (account, job, rank and incarnation), then
        routed."""
        reg = self._registered(ident, frame)
        if reg is None:
            return
        t = frame.type
        key = frame.key()
        cluster = self.server.cfg.cluster
        me = (key.src_cluster, key.src_rank) if t == FrameType.DATA else (key.dst_cluster, key.dst_rank)
        if key.account != reg.account or key.job != reg.job or me != (cluster, reg.rank):
            self.refuse(
                ident,
                "not_attributed",
                f"frame names account {key.account!r} job {key.job!r} endpoint {me}, but this connection is "
                f"account {reg.account!r} job {reg.job!r} rank {reg.rank} of cluster {cluster!r}",
                frame,
            )
            return
        inc = frame.meta.get("inc", 0)
        if inc != reg.inc:
            self.refuse(ident, "bad_incarnation", f"frame names incarnation {inc}, but this connection is "
                        f"incarnation {reg.inc} of rank {reg.rank} (given in its WELCOME)", frame)
            return
        if t == FrameType.DATA and not reg.note_sent(frame.header.channel_id, frame.header.seq):
            self.refuse(ident, "too_many_channels", f"rank {reg.rank} has opened {len(reg.sent)} sending channels "
                        "on this switch, the most one connection may; reuse channels", frame)
            return
        party = ("account", reg.account)
        budget = self.server.budget
        share = budget.share(party)
        if share.cap_bytes is None:
            share.cap_bytes = self.server.budgets.account
        if share.used > share.cap_bytes and self.registry.others_active(reg.account):
            # over its share while other accounts work here: this account's frames are dropped (its workers
            # send them again), rather than holding back the one socket all accounts' workers share
            self.dropped(reg.account, "account_over_budget", f"account {reg.account!r} has {share.used} bytes "
                         f"queued here, over limits.account_memory_bytes={share.cap_bytes}")
            return
        limit = self.server.cfg.link.max_message_bytes
        if t == FrameType.DATA and frame.header.total_len > limit:
            self.refuse(ident, "too_large", f"message of {frame.header.total_len} bytes exceeds link.max_message_bytes="
                        f"{limit}; split it or raise the limit", frame)
            return
        stages = reg.routes.get(key.dst_cluster, reg.routes.get(cluster, ())) if reg.routes else ()
        err = self.server.route(frame, bytes(head.buffer), payload, origin=None, party=party, stages=stages)
        if err is not None:
            self.refuse(ident, err[0], err[1], frame)
        wait = self.server.account_bucket(reg.account).take(len(payload) + len(head.buffer))
        if wait > 0:  # per-account rate limit: stop reading until the account's bucket has refilled
            self.throttled = True
            asyncio.get_running_loop().call_later(wait, self._unthrottle)

    def ack_refusal(self, frame: Frame) -> tuple[str, str, bool] | None:
        """For an ACK to one of our ranks (from a peer or a local worker): (code, reason, audited) if it must not
        reach it: it names an earlier start of the rank (dropped quietly: the normal aftermath of a restart), or
        acknowledges more than the rank sent on that channel (refused and audited); None if it may go on."""
        key = frame.key()
        reg = self.registry.at((key.account, key.job, key.src_rank))
        if reg is None:
            return None  # (held for the rank, if it comes back; a new start of it ignores it)
        if frame.meta.get("to", 0) != reg.inc:
            return "stale_ack", f"acknowledgement for incarnation {frame.meta.get('to', 0)} of rank {reg.rank}, " \
                                f"which is now incarnation {reg.inc}", False
        why = reg.ack_refusal(frame.header.channel_id, frame.header.seq)
        return None if why is None else ("ack_beyond_sent", f"acknowledgement on channel {key.name!r} refused: "
                                                            f"{why}; a receiver acknowledges only what it got", True)

    def _dropped_by_zmq(self, transport: str, peer: str) -> None:
        """ZeroMQ ended a worker connection with bytes of it unread (`ConnectionWatch`): counted, audited in
        aggregate per transport."""
        limit = self.router.maxmsgsize if self.router is not None else -1
        self.server.metrics.refused.labels(reason="part_too_large").inc()
        log.info("ZeroMQ ended the %s connection of %s in the middle of a message", transport, peer)
        self.server.audit_limited(("connection_dropped", transport), self.server.actor, "connection_dropped",
                                  f"worker@{transport}:{peer}", "denied", {
                                      "reason": "part_too_large", "transport": transport, "peer": peer,
                                      "limit_bytes": limit,
                                      "detail": f"a message part over the local socket's limit of {limit} bytes "
                                                "(2 x link.chunk_bytes + frame head; workers split messages into "
                                                "link.chunk_bytes frames), or bytes that are not ZeroMQ framing: "
                                                "the connection was closed before the part was read"})

    def _shm_payload(self, ident: bytes, desc: memoryview) -> memoryview | None:
        """The payload a worker placed in its arena; None if stale (sent before a switch restart, or into an arena
        since replaced: the worker sends those messages again); WireError if the descriptor is unsound."""
        reg = self.registry.get(ident)
        payload = reg.shm.up_payload(desc) if reg is not None and reg.shm is not None else None
        if payload is None:
            self.server.metrics.refused.labels(reason="stale_shm").inc()
            log.info("dropped a frame in a shared-memory arena this connection no longer has")
            return None
        self.server.metrics.shm_bytes["in"] += len(payload)
        return payload

    # ---- registration ----
    def _on_hello(self, frame: Frame, ident: bytes, name: str, account: str, *_: Any) -> None:
        taken = self.desk.take(frame, ident, name, account)
        if taken is None:
            return
        reg, new, replaced = taken
        if replaced is not None:
            self._forget(replaced.ident)
            if replaced.inc != reg.inc:  # a new start of the rank: what its predecessor sent expires
                self.server.incarnation_ended(replaced.account, replaced.job, replaced.rank, replaced.inc)
        # the WELCOME first: it names the worker's incarnation, and frames held for its rank may be on the control
        # lane too (queued before it there, they would reach a worker that does not know who it is yet)
        self.send_control(ident, FrameType.WELCOME, self.desk.welcome(reg, frame.meta.get("shm")))
        if new:
            self.server.metrics.workers.set(len(self.registry))
            self.delivery.adopt(reg.addr, ident)
        self.flush(ident)

    def _ready_shm(self, ident: bytes) -> WorkerShm | None:
        reg = self.registry.get(ident)
        return reg.shm if reg is not None and reg.shm is not None and reg.shm.ready else None

    def _forget(self, ident: bytes) -> None:
        reg = self.registry.remove(ident)
        if reg is not None and reg.shm is not None:
            reg.shm.close()
        self.delivery.drop(ident, reg.addr if reg is not None else None)
        self.server.metrics.workers.set(len(self.registry))

    # ---- sending ----
    def refuse(self, ident: bytes, code: str, message: str, frame: Any = None) -> None:
        """Send an ERROR frame with `code` and `message` to the worker that sent `frame` (a connection that draws
        refusals faster than ANSWERS_PER_S gets no more answers meanwhile: counted and audited in aggregate)."""
        self.server.metrics.refused.labels(reason=code).inc()
        log.info("refused frame from worker: %s: %s", code, message)
        reg = self.registry.get(ident)
        if code in AUDITED_REFUSALS:
            self.server.audit_limited(("worker_refused", code, reg.account if reg else ""), self.server.actor,
                                      "frame_refused", f"worker:{reg.name}" if reg else "worker", "denied",
                                      {"reason": code, "detail": message[:300],
                                       "account": reg.account if reg else None})
        if not self._may_answer(ident, code):
            return
        meta: dict[str, Any] = {"code": code, "message": message}
        seq = 0
        if frame is not None and frame.type in (FrameType.DATA, FrameType.ACK):
            meta["channel"] = frame.key().to_meta()
            seq = frame.header.seq
        self.send_control(ident, FrameType.ERROR, meta, seq=seq)

    def _may_answer(self, ident: bytes, why: str) -> bool:
        if self.answers.take(ident, time.monotonic()):
            return True
        self.server.metrics.refused.labels(reason="answers_limited").inc()
        reg = self.registry.get(ident)
        self.server.audit_limited(("worker_flood", why, reg.account if reg else ""), self.server.actor,
                                  "frame_refused", f"worker:{reg.name}" if reg else "worker", "denied",
                                  {"reason": "answers_limited", "frames": why, "account": reg.account if reg else None,
                                   "detail": f"a connection sent {why} frames faster than the switch answers them "
                                             "(ANSWERS_PER_S a second): the rest are read and dropped unanswered"})
        return False

    def deliver(self, key: ChannelKey, rank: int, lane: Lane, head: bytes, payload: Any, origin: Origin | None,
                party: Party | None = None, src: Source | None = None) -> None:
        """Queue a frame of channel `key` for local rank `rank` of its (account, job); held briefly if that rank has
        not said hello (within the account's limits.pending_bytes: beyond, dropped, and its sender sends it again
        later; a peer that sent it is asked to hold that account's frames back a while). `src`: the sending start
        of a DATA frame (cluster, rank, incarnation): a frame held for a rank expires when that start has ended."""
        addr = (key.account, key.job, rank)
        if not self.delivery.deliver(addr, self.registry.by_addr.get(addr), lane, head, payload, origin, party, src):
            if origin is not None:
                origin.dropped(key, len(head) + len(payload))
            self.dropped(key.account, "pending_over_budget", f"frames held for ranks of account {key.account!r} "
                         f"that have not connected exceed limits.pending_bytes={self.server.budgets.pending}")
        return None

    def dropped(self, account: str, code: str, message: str) -> None:
        """A frame was dropped to keep one account within its budget (its sender resends it): counted, audited
        in aggregate."""
        self.server.metrics.refused.labels(reason=code).inc()
        self.server.audit_limited(("frame_dropped", account, code), self.server.actor, "frame_dropped", account,
                                  "denied", {"reason": code, "detail": message})

    def sweep(self) -> None:
        """Drop frames held for ranks that never said hello, and registrations of workers long silent (whose
        start has then ended)."""
        self.delivery.sweep()
        now = time.monotonic()
        for reg in self.registry:
            if now - reg.last_seen > SILENT_S:
                self._forget(reg.ident)
                self.server.incarnation_ended(reg.account, reg.job, reg.rank, reg.inc)

    def hold_back(self, paused: bool) -> None:
        """Stop (or resume) reading worker frames while over the memory cap."""
        self.held = paused
        if not paused:
            self.kick()

    def broadcast(self, make: Callable[[], dict]) -> None:
        """Send a fresh WELCOME (link states) to every registered worker."""
        meta = make()
        for reg in self.registry:
            self.send_control(reg.ident, FrameType.WELCOME, {**meta, "inc": reg.inc})
