"""Cluster-private side: a ZeroMQ ROUTER for workers, with a ZAP handler mapping keys to accounts.

Workers on other hosts of the cluster connect over TCP with CURVE. Workers on the switch's own host may use the
optional IPC endpoint instead: the kernel carries those bytes, so they skip CURVE's encryption, and the worker
authenticates with ZeroMQ PLAIN: its public key as user name and a password only the holder of its CURVE secret
key can compute (`security.curve.local_password`). Both endpoints belong to one socket, so routing is the same.
Such a worker may also take a shared-memory arena for its payloads (`nebula.wire.shm`, `local.shm_bytes`).
"""
from __future__ import annotations

import asyncio
import hmac
import logging
import os
import time
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import zmq
import zmq.asyncio
from zmq.utils import z85

from nebula.config import LocalConfig
from nebula.wire import Frame, FrameType, Lane, WireError, decode_frame, decode_head, encode_frame
from nebula.wire.shm import (RELEASE_BATCH, RELEASE_DELAY_S, SHM_MIN_BYTES, SHM_TAG, Arena, Ring, pack_desc,
                              release_now, unpack_desc)
from security.curve import local_password
from switch_server.lanes import LaneQueues

if TYPE_CHECKING:  # pragma: no cover
    from switch_server.server import SwitchServer

log = logging.getLogger(__name__)

ZAP_ENDPOINT = "inproc://zeromq.zap.01"
ZAP_DOMAIN = b"nebula"
SNDHWM = 8  # frames queued per worker inside ZeroMQ; the rest waits in our lane queues so priorities hold
PENDING_TTL_S = 30.0
# worker frames handled per wake-up: small, so a frame for a higher lane waits behind few bulk frames before the
# link writer runs
PUMP_BATCH = 16
RANK_HELD_S = 3.0  # a rank whose connection sent a HELLO this recently is not handed to another connection


class WorkerShm:
    """The switch's side of one worker connection's arena: it releases upward regions once nothing here refers
    to them any more, and allocates downward regions for the worker."""

    def __init__(self, half: int, on_release: Callable[[WorkerShm], None]) -> None:
        self.arena = Arena.create(half)
        self.down = Ring(half)
        self.ready = False  # the worker has mapped it: downward payloads may use it
        self.released: list[int] = []
        self.released_bytes = 0
        self._on_release = on_release

    def offer(self) -> dict[str, int]:
        """WELCOME's description of the arena, for the worker to map it."""
        return {"pid": os.getpid(), "fd": self.arena.fd, "token": self.arena.token, "bytes": self.arena.half}

    def up_payload(self, off: int, n: int) -> memoryview:
        """The worker's payload at `off`; the region goes back to the worker when the last view of it is gone
        (the link's retransmit buffer, a queue, a failed route: wherever it was last held)."""
        arr = np.frombuffer(self.arena.region(self.arena.up, off, n), dtype=np.uint8)
        weakref.finalize(arr, self._released, off, n).atexit = False
        return memoryview(arr)

    def _released(self, off: int, n: int) -> None:
        self.released.append(off)
        self.released_bytes += n
        self._on_release(self)

    def close(self) -> None:
        self.arena.close_fd()


@dataclass(slots=True)
class Registration:
    """A worker connection that said hello: who it is and what it may address."""

    ident: bytes
    account: str
    job: str
    rank: int
    name: str
    last_seen: float
    shm: WorkerShm | None = None


class Outbox:
    """Frames waiting to be handed to one local worker (or to a rank not yet connected)."""

    __slots__ = ("lanes", "since", "retry")

    def __init__(self) -> None:
        self.lanes = LaneQueues()
        self.since = time.monotonic()
        self.retry: asyncio.TimerHandle | None = None


def bind_endpoint(endpoint: str) -> str:
    """ZeroMQ bind form of `endpoint`: a port of 0 means any free port."""
    if endpoint.startswith("tcp://") and endpoint.endswith(":0"):
        return endpoint[:-2] + ":*"
    return endpoint


class LocalSide:
    """ROUTER socket for the cluster's workers; attributes every frame to an account and a job."""

    def __init__(self, server: SwitchServer, cfg: LocalConfig, public_key: bytes, secret_key: bytes) -> None:
        self.server = server
        self.cfg = cfg
        self.ctx = zmq.asyncio.Context()
        self.public_key = public_key
        self.secret_key = secret_key
        self.keys: dict[str, Any] = {}  # z85 public key -> WorkerIdentity
        self.set_workers(cfg.workers)
        self.by_ident: dict[bytes, Registration] = {}
        self.by_addr: dict[tuple[str, str, int], bytes] = {}
        self.outboxes: dict[bytes, Outbox] = {}
        self.pending: dict[tuple[str, str, int], Outbox] = {}
        self.endpoint = ""
        self.router: zmq.asyncio.Socket | None = None
        self.sync: zmq.Socket | None = None
        self.zap: zmq.asyncio.Socket | None = None
        self.tasks: list[asyncio.Task] = []
        self.held = False  # over the memory cap: workers are held back by ZeroMQ's own limits
        self.throttled = False
        self._kicked = False
        self._releasing: set[WorkerShm] = set()
        self._release_timer: asyncio.TimerHandle | None = None
        self._release_soon = False

    def set_workers(self, workers: tuple) -> None:
        """Replace the accepted worker keys (hot reload)."""
        self.keys = {w.curve_public_key: w for w in workers}
        secret = self.secret_key.decode()
        self.passwords = {k: local_password(secret, k).encode() for k in self.keys}

    async def start(self) -> str:
        """Bind the ZAP handler and the ROUTER; return the bound endpoint."""
        self.zap = self.ctx.socket(zmq.REP)
        self.zap.linger = 0
        self.zap.bind(ZAP_ENDPOINT)
        r = self.router = self.ctx.socket(zmq.ROUTER)
        r.linger = 0
        r.curve_server = True
        r.curve_publickey = self.public_key
        r.curve_secretkey = self.secret_key
        r.zap_domain = ZAP_DOMAIN
        r.setsockopt(zmq.ROUTER_MANDATORY, 1)
        r.sndhwm = SNDHWM
        r.rcvhwm = 16  # frames waiting here are FIFO: keep few, so priorities act in our lanes instead
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
        asyncio.get_running_loop().add_reader(self.sync.FD, self._pump)  # at once: a readable edge costs no extra loop turn
        self.tasks = [asyncio.create_task(self._zap_loop()), asyncio.create_task(self._safety_kick())]
        self.kick()
        return self.endpoint

    async def stop(self) -> None:
        """Close sockets and stop tasks."""
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.sync is not None:
            asyncio.get_running_loop().remove_reader(self.sync.FD)
            self.sync = None
        for s in (self.router, self.zap):
            if s is not None:
                s.close(0)
        self.ctx.destroy(linger=0)  # closes anything still open instead of waiting for it

    # ---- authentication ----
    async def _zap_loop(self) -> None:
        assert self.zap is not None
        while True:
            msg = await self.zap.recv_multipart()
            try:
                reply = self._zap_reply(msg)
            except Exception:  # never let one bad request stop authentication for everyone
                log.exception("ZAP request failed")
                reply = [b"1.0", msg[1] if len(msg) > 1 else b"", b"500", b"internal error", b"", b""]
            await self.zap.send_multipart(reply)

    def _zap_reply(self, msg: list[bytes]) -> list[bytes]:
        version, request_id, domain, address, _identity, mechanism = msg[:6]
        creds = msg[6:]
        addr = address.decode(errors="replace")
        transport = "tcp"
        if mechanism == b"PLAIN" and len(creds) == 2:  # only the IPC listener speaks PLAIN
            transport = "ipc"
            key = creds[0].decode(errors="replace")
            expected = self.passwords.get(key)
            if expected is not None and not hmac.compare_digest(creds[1], expected):
                self.server.metrics.refused.labels(reason="bad_local_password").inc()
                self.server.audit("worker", "worker_rejected", addr, "denied",
                                  {"reason": "bad_password", "curve_public_key": key, "transport": "ipc"})
                return [version, request_id, b"400", b"wrong password for this key", b"", b""]
        elif mechanism == b"CURVE" and creds and len(creds[0]) == 32:
            key = z85.encode(creds[0]).decode()
        else:
            self.server.audit("worker", "worker_rejected", addr, "denied", {"reason": "not_curve"})
            return [version, request_id, b"400", b"CURVE required", b"", b""]
        worker = self.keys.get(key)
        if worker is None:
            self.server.metrics.refused.labels(reason="unknown_worker_key").inc()
            self.server.audit(
                "worker", "worker_rejected", addr, "denied", {"reason": "unknown_key", "curve_public_key": key}
            )
            return [version, request_id, b"400", b"unknown CURVE key; add it under local.workers", b"", b""]
        self.server.audit(f"worker:{worker.name}", "worker_accepted", addr, "ok",
                          {"account": worker.account, "transport": transport})
        # User-Id carries "name/account" so every frame names its credential and account
        return [version, request_id, b"200", b"OK", f"{worker.name}/{worker.account}".encode(), b""]

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
        user = head.get("User-Id")
        name, _, account = user.partition("/")
        try:
            frame = decode_frame(head.buffer, payload, max_payload_bytes=self.server.cfg.link.chunk_bytes)
        except WireError as exc:
            self.refuse(ident, exc.code, f"malformed frame: {exc.message}")
            return
        t = frame.type
        if t == FrameType.HELLO:
            self._hello(ident, name, account, frame.meta)
            return
        if t == FrameType.BYE:
            if ident in self.by_ident:
                self._forget(ident)
            return
        reg = self.by_ident.get(ident)
        if reg is None:
            self.refuse(ident, "no_hello", "send HELLO (job, rank) before any other frame", frame)
            return
        reg.last_seen = time.monotonic()
        if t == FrameType.SHM_RELEASE:
            if reg.shm is not None and frame.meta["token"] == reg.shm.arena.token:
                for off in frame.meta["offsets"]:
                    reg.shm.down.free(off)  # (an unknown offset is a stale release: nothing to free)
            return
        if t not in (FrameType.DATA, FrameType.ACK):
            self.refuse(ident, "bad_type", f"workers may send HELLO, BYE, DATA, ACK and SHM_RELEASE frames, not {t.name}",
                        frame)
            return
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
        if t == FrameType.DATA and frame.header.total_len > self.server.cfg.link.max_message_bytes:
            self.refuse(
                ident,
                "too_large",
                f"message of {frame.header.total_len} bytes exceeds link.max_message_bytes="
                f"{self.server.cfg.link.max_message_bytes}; split it or raise the limit",
                frame,
            )
            return
        err = self.server.route(frame, bytes(head.buffer), payload, origin=None)
        if err is not None:
            self.refuse(ident, err[0], err[1], frame)
        wait = self.server.account_bucket(reg.account).take(len(payload) + len(head.buffer))
        if wait > 0:  # per-account rate limit: stop reading until the account's bucket has refilled
            self.throttled = True
            asyncio.get_running_loop().call_later(wait, self._unthrottle)

    def _shm_payload(self, ident: bytes, desc: memoryview) -> memoryview | None:
        """The payload a worker placed in its arena; None if stale (sent before a switch restart, or into an arena
        since replaced: the worker sends those messages again); WireError if the descriptor is unsound."""
        token, off, n = unpack_desc(desc)
        reg = self.by_ident.get(ident)
        if reg is None or reg.shm is None or token != reg.shm.arena.token:
            self.server.metrics.refused.labels(reason="stale_shm").inc()
            log.info("dropped a frame in a shared-memory arena this connection no longer has")
            return None
        payload = reg.shm.up_payload(off, n)
        self.server.metrics.shm_bytes["in"] += n
        return payload

    def _shm_released(self, shm: WorkerShm) -> None:
        """An upward region is free (called as its last view goes): tell the worker, batched."""
        self._releasing.add(shm)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # shutting down: the arena goes with the process
            return
        if release_now(shm.released_bytes, shm.arena.half):
            if not self._release_soon:
                self._release_soon = True
                loop.call_soon(self._send_releases)
        elif self._release_timer is None:
            self._release_timer = loop.call_later(RELEASE_DELAY_S, self._send_releases)

    def _send_releases(self) -> None:
        if self._release_timer is not None:
            self._release_timer.cancel()
            self._release_timer = None
        self._release_soon = False
        owners = {id(r.shm): ident for ident, r in self.by_ident.items() if r.shm is not None}
        for shm in self._releasing:
            offsets, shm.released, shm.released_bytes = shm.released, [], 0
            ident = owners.get(id(shm))
            if ident is None:  # the connection is gone, and its arena with it
                continue
            for i in range(0, len(offsets), RELEASE_BATCH):
                self.send_control(ident, FrameType.SHM_RELEASE,
                                  {"token": shm.arena.token, "offsets": offsets[i : i + RELEASE_BATCH]})
        self._releasing.clear()

    def _hello(self, ident: bytes, name: str, account: str, meta: dict) -> None:
        job, rank = meta["job"], meta["rank"]
        worker = next((w for w in self.keys.values() if w.name == name and w.account == account), None)
        if meta["account"] != account:
            self.refuse(ident, "not_attributed", f"HELLO names account {meta['account']!r} but this key belongs to {account!r}")
            return
        if worker is None or ("*" not in worker.jobs and job not in worker.jobs):
            self.server.audit(f"worker:{name}", "job_rejected", job, "denied", {"account": account, "rank": rank})
            self.refuse(ident, "job_denied", f"credential {name!r} may not join job {job!r}; allowed: {list(worker.jobs) if worker else []}")
            return
        addr = (account, job, rank)
        old = self.by_addr.get(addr)
        if old is not None and old != ident and time.monotonic() - self.by_ident[old].last_seen < RANK_HELD_S:
            # two live processes claiming one rank would steal each other's frames; a restarted worker's old
            # connection falls silent, so the newcomer gets the rank after RANK_HELD_S
            self.refuse(ident, "rank_taken", f"rank {rank} of job {job!r} (account {account!r}) is connected from "
                        "another process; give every process its own rank, or close the other endpoint")
            return
        if old != ident:
            if old is not None:
                self._forget(old)
            prev = self.by_ident.get(ident)
            if prev is not None:
                self.by_addr.pop((prev.account, prev.job, prev.rank), None)
            self.by_addr[addr] = ident
            self.by_ident[ident] = Registration(ident, account, job, rank, name, time.monotonic())
            self.server.metrics.workers.set(len(self.by_ident))
            log.info("worker %s account %s joined job %s as rank %d", name, account, job, rank)
            box = self.pending.pop(addr, None)
            if box is not None:
                mine = self.outboxes.setdefault(ident, Outbox())
                while (item := box.lanes.pop()) is not None:
                    mine.lanes.push(*item)
        else:
            self.by_ident[ident].last_seen = time.monotonic()
        self.send_control(ident, FrameType.WELCOME, self._offer_shm(self.by_ident[ident], meta.get("shm")))
        self.flush(ident)

    def _offer_shm(self, reg: Registration, mapped: Any) -> dict:
        """WELCOME meta for a worker, with its arena when it asked for one (HELLO's `shm`: the token of the arena
        it has mapped, 0 for none yet)."""
        welcome = self.server.welcome_meta()
        if not self.cfg.shm_bytes or not isinstance(mapped, int) or isinstance(mapped, bool):
            return welcome
        if reg.shm is None:
            try:
                reg.shm = WorkerShm(self.cfg.shm_bytes, self._shm_released)
            except OSError as exc:
                log.warning("no shared-memory arena for worker %s (%s); its payloads go through the socket", reg.name, exc)
                return welcome
        reg.shm.ready = mapped == reg.shm.arena.token
        return {**welcome, "shm": reg.shm.offer()}

    def _forget(self, ident: bytes) -> None:
        reg = self.by_ident.pop(ident, None)
        if reg is not None and self.by_addr.get((reg.account, reg.job, reg.rank)) == ident:
            del self.by_addr[(reg.account, reg.job, reg.rank)]
        if reg is not None and reg.shm is not None:
            reg.shm.close()
        box = self.outboxes.pop(ident, None)
        if box is not None:
            if box.retry is not None:
                box.retry.cancel()
            if reg is not None and box.lanes:
                # kept for the rank's next connection (a worker that reconnects gets them without a resend)
                held = self.pending.setdefault((reg.account, reg.job, reg.rank), Outbox())
                while (item := box.lanes.pop()) is not None:
                    lane, entry, n = item
                    if entry[3]:  # data, not a control frame meant for the old connection
                        held.lanes.push(lane, entry, n)
                    else:
                        self._release(entry)
            else:
                for item in box.lanes.clear():
                    self._release(item)
        self.server.metrics.workers.set(len(self.by_ident))

    # ---- sending ----
    def refuse(self, ident: bytes, code: str, message: str, frame: Any = None) -> None:
        """Send an ERROR frame with `code` and `message` to the worker that sent `frame`."""
        self.server.metrics.refused.labels(reason=code).inc()
        log.info("refused frame from worker: %s: %s", code, message)
        meta: dict[str, Any] = {"code": code, "message": message}
        seq = 0
        if frame is not None and frame.type in (FrameType.DATA, FrameType.ACK):
            meta["channel"] = frame.key().to_meta()
            seq = frame.header.seq
        self.send_control(ident, FrameType.ERROR, meta, seq=seq)

    def send_control(self, ident: bytes, ftype: FrameType, meta: dict, seq: int = 0) -> None:
        """Queue a control frame for one worker connection."""
        head = encode_frame(ftype, meta, seq=seq)
        box = self.outboxes.setdefault(ident, Outbox())
        box.lanes.push(Lane.CONTROL, (head, b"", None, False), len(head))
        self.flush(ident)

    def deliver(self, account: str, job: str, rank: int, lane: Lane, head: bytes, payload: Any, origin: Any) -> None:
        """Queue a frame for local rank `rank` of (account, job); held briefly if that rank has not said hello."""
        n = len(head) + len(payload)
        ident = self.by_addr.get((account, job, rank))
        self.server.mem_used += n
        if ident is None:
            box = self.pending.get((account, job, rank))
            if box is None:
                box = self.pending[(account, job, rank)] = Outbox()
            box.lanes.push(lane, (head, payload, origin, True), n)
            return
        box = self.outboxes.get(ident)
        if box is None:
            box = self.outboxes[ident] = Outbox()
        box.lanes.push(lane, (head, payload, origin, True), n)
        self.flush(ident)

    def _release(self, item: tuple) -> None:
        head, payload, origin, counted = item
        n = len(head) + len(payload)
        if counted:
            self.server.mem_used -= n
        if origin is not None:
            origin.release(n)

    def flush(self, ident: bytes) -> None:
        """Hand queued frames to ZeroMQ by priority until its per-worker queue is full."""
        self._flush(ident)
        self.kick()  # a send may have eaten the socket's readable edge

    def _flush(self, ident: bytes) -> None:
        box = self.outboxes.get(ident)
        if box is None or self.sync is None:
            return
        if box.retry is not None:
            box.retry.cancel()
            box.retry = None
        sock = self.sync
        reg = self.by_ident.get(ident)
        shm = reg.shm if reg is not None and reg.shm is not None and reg.shm.ready else None
        while True:
            item = box.lanes.pop()
            if item is None:
                break
            lane, entry, n = item
            head, payload = entry[0], entry[1]
            off = None
            if shm is not None and entry[3] and len(payload) >= SHM_MIN_BYTES:
                off = shm.down.alloc(len(payload))  # (None when the worker still holds too much: inline then)
            if off is not None:
                shm.arena.down[off : off + len(payload)] = payload
                parts = [ident, head, SHM_TAG, pack_desc(shm.arena.token, off, len(payload))]
            else:
                parts = [ident, head, payload] if payload else [ident, head]
            try:
                sock.send_multipart(parts, zmq.NOBLOCK, copy=False)
            except zmq.Again:
                if off is not None:
                    shm.down.free(off)
                box.lanes.push_front(lane, entry, n)
                box.retry = asyncio.get_running_loop().call_later(0.001, self.flush, ident)
                return
            except zmq.ZMQError as exc:
                if exc.errno == zmq.EHOSTUNREACH:  # the worker went away; its frames will be retransmitted end to end
                    if off is not None:
                        shm.down.free(off)
                    box.lanes.push_front(lane, entry, n)
                    self._forget(ident)
                    return
                raise
            if payload:
                self.server.metrics.count("local", lane, "out", n)
                if off is not None:
                    self.server.metrics.shm_bytes["out"] += len(payload)
            self._release(entry)
        self.server.maybe_resume()

    def sweep(self) -> None:
        """Drop frames held for ranks that never said hello, and registrations of workers long silent."""
        now = time.monotonic()
        for addr, box in list(self.pending.items()):
            if now - box.since > PENDING_TTL_S:
                for item in box.lanes.clear():
                    self._release(item)
                del self.pending[addr]
        for ident, reg in list(self.by_ident.items()):
            if now - reg.last_seen > 120.0:
                self._forget(ident)
        self.server.maybe_resume()

    def hold_back(self, paused: bool) -> None:
        """Stop (or resume) reading worker frames while over the memory cap."""
        self.held = paused
        if not paused:
            self.kick()

    def broadcast(self, make: Callable[[], dict]) -> None:
        """Send a fresh WELCOME (link states) to every registered worker."""
        meta = make()
        for ident in list(self.by_ident):
            self.send_control(ident, FrameType.WELCOME, meta)
