"""Cluster-private side: a ZeroMQ ROUTER for the cluster's workers; registration (HELLO) and delivery to them.

Workers on other hosts of the cluster connect over TCP with CURVE. Workers on the switch's own host may use the
optional IPC endpoint instead: the kernel carries those bytes, so they skip CURVE's encryption, and the worker
authenticates with ZeroMQ PLAIN (`switch_server.zap`). Both endpoints belong to one socket, so routing is the same.
Beside the IPC endpoint the switch listens on a Unix stream socket that speaks no ZeroMQ
(`switch_server.localstream`, the default for same-host workers): its messages join the ROUTER's here, identity
first. Such a worker may also take a shared-memory arena for its payloads (`switch_server.localshm`,
`local.shm_bytes`).
"""
from __future__ import annotations

__all__ = ["LocalSide", "bind_endpoint"]

import asyncio
import logging
from typing import Any, Callable

import zmq
import zmq.asyncio

from nebula.config import LocalConfig
from nebula.wire import (HEADER_BYTES, MAX_META_BYTES, ChannelKey, Dispatcher, Frame, FrameType, Lane, WireError,
                         decode_frame,
                         decode_head)
from nebula.wire.batch import table_refusal
from nebula.wire.shm import SHM_TAG
from switch_server.admission import ack_refusal, attribution_refusal
from switch_server.budget import Party
from switch_server.delivery import Delivery, Source
from switch_server.host import LocalHost, Origin
from switch_server.hello import HelloDesk
from switch_server.incarnations import Incarnations
from switch_server.localconns import WorkerConnections
from switch_server.localrefusals import Refusals
from switch_server.localshm import ShmReleases
from switch_server.localstream import PUMP_BATCH, LocalSockets, StreamWorkers, open_streams
from switch_server.localwatch import ConnectionWatch
from switch_server.registry import WorkerRegistry
from switch_server.zap import ZAP_DOMAIN, ZapHandler

log = logging.getLogger(__name__)

SNDHWM = 8  # frames queued per worker inside ZeroMQ; the rest waits in our lane queues so priorities hold
SILENT_S = 120.0  # a registration with no frame for this long is forgotten


def bind_endpoint(endpoint: str) -> str:
    """ZeroMQ bind form of `endpoint`: a port of 0 means any free port."""
    if endpoint.startswith("tcp://") and endpoint.endswith(":0"):
        return endpoint[:-2] + ":*"
    return endpoint


class LocalSide:
    """ROUTER socket for the cluster's workers; attributes every frame to an account and a job."""

    def __init__(self, server: LocalHost, cfg: LocalConfig, public_key: bytes, secret_key: bytes,
                 incs: Incarnations) -> None:
        self.server, self.cfg, self.ctx = server, cfg, zmq.asyncio.Context()
        self.public_key, self.secret_key = public_key, secret_key
        self.registry = WorkerRegistry()
        self.zap = ZapHandler(secret_key, server.metrics, server.audit)
        self.refusals = Refusals(server, self.registry, lambda: self.router.maxmsgsize if self.router is not None else -1)
        self.zap.set_workers(cfg.workers)
        self.delivery = Delivery(server, lambda ident: self.conns.ready_shm(ident),
                                 lambda ident: self.conns.forget(ident), self.kick)
        self.send_control = self.refusals.send_control = self.delivery.send_control
        self.refuse, self.dropped = self.refusals.refuse, self.refusals.dropped
        self.flush = self.delivery.flush
        self.endpoint = ""
        self.router: zmq.asyncio.Socket | None = None
        self.sync: zmq.Socket | None = None
        self.streams: StreamWorkers | None = None  # the Unix stream endpoint's workers (beside IPC)
        self.watch: ConnectionWatch | None = None
        self.tasks: list[asyncio.Task] = []
        # over the memory cap (held) or an account's rate (throttled): workers are held back by the sockets' limits
        self.held = self.throttled = self._kicked = False
        self.shm_releases = ShmReleases(lambda ident, meta: self.send_control(ident, FrameType.SHM_RELEASE, meta))
        self.desk = HelloDesk(server, self.registry, incs, self.refuse, lambda: self.zap.keys, cfg.shm_bytes,
                              self.shm_releases.released)
        self.conns = WorkerConnections(server, self.registry, self.refusals, self.desk, self.delivery)
        self.on_frame = Dispatcher("the local side (workers may send HELLO, BYE, DATA, ACK and SHM_RELEASE)", {
            FrameType.HELLO: self.conns.on_hello,
            FrameType.BYE: self.conns.on_bye,
            FrameType.SHM_RELEASE: self.conns.on_shm_release,
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
        self.sync = zmq.Socket.shadow(r.underlying)
        self.streams = await open_streams(self) if self.cfg.ipc_endpoint or self.cfg.tls_endpoint else None
        self.delivery.sock = LocalSockets(self.sync, self.streams)
        self.watch = ConnectionWatch(r, self.refusals.dropped_by_zmq)
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
        if self.streams is not None:
            await self.streams.stop()
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
        if self.streams is not None and self.streams.paused:
            self.streams.resume()
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
                payload = self.conns.shm_payload(ident, parts[3].buffer)
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

    def _on_routed(self, frame: Frame, ident: bytes, _name: str, _account: str, head: zmq.Frame, payload: Any) -> None:
        """A worker's DATA or ACK: attributed to its registration (account, job, rank and incarnation), then
        routed."""
        reg = self.conns.registered(ident, frame)
        if reg is None:
            return
        cluster = self.server.cfg.cluster
        refused = attribution_refusal(frame, reg, cluster)
        if refused is not None:
            self.refuse(ident, *refused, frame)
            return
        t, key = frame.type, frame.key()
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
        lie = table_refusal(frame.meta, payload)
        if lie is not None:
            self.refuse(ident, *lie, frame)
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
        """For an ACK to one of our ranks: why it must not reach it (`switch_server.admission.ack_refusal`)."""
        return ack_refusal(frame, self.registry)

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

    def sweep(self) -> None:
        """Drop frames held for ranks that never said hello, and registrations of workers long silent (whose
        start has then ended)."""
        self.delivery.sweep()
        self.conns.forget_silent(SILENT_S)

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
