"""Worker side of the switch: an Endpoint (one authenticated ZeroMQ connection, one I/O thread) and its Channels.

The connection is CURVE over TCP, or, for a worker on the switch's own host, the switch's IPC endpoint with a
password derived from the same CURVE keys (the kernel carries those bytes, so they need no encryption). Over
IPC, payloads go through a shared-memory arena the switch offers (`nebula.wire.shm`) instead of the socket.

Every message on a channel gets a sequence number. The receiving worker delivers each exactly once and in
order, and acknowledges what it received and what the application consumed; the sender keeps every
unacknowledged message and sends it again when its switch or the peer's switch restarted (seen through the
switch's epoch numbers) or when no acknowledgement came for a long time. What the receiver consumed opens
the sender's window: credit-based flow control from end to end.
"""
from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import zmq
import zmq.auth
from zmq.utils.monitor import recv_monitor_message

from nebula.config.worker import WorkerConfig, load_worker_config, local_endpoint
from nebula.wire import (
    ChannelKey,
    FrameType,
    Lane,
    WireError,
    decode_frame,
    encode_frame,
    encode_meta,
    lane_of,
)
from nebula.wire.shm import (RELEASE_BATCH, RELEASE_DELAY_S, SHM_MIN_BYTES, SHM_TAG, Arena, Ring, pack_desc,
                              release_now, unpack_desc)
from security.curve import local_password

log = logging.getLogger(__name__)

HEARTBEAT_S = 1.0  # HELLO (and the switch's WELCOME answer) this often
SWITCH_SILENT_S = 5.0  # no WELCOME for this long: our own switch is unreachable
RTO_S = 10.0  # resend a message with no acknowledgement progress for this long (then doubling)
RTO_MAX_S = 60.0
RTO_BYTES_PER_S = 4e6  # the slowest link the fallback timer allows for before resending
DEFAULT_WINDOW_BYTES = 256 * 1024**2
SNDHWM = 16  # frames inside ZeroMQ; more wait in our lanes so a small activation can overtake bulk frames
# a full shared-memory arena is waited on this long (the switch hands regions back as its link sends them);
# then payloads go through the socket until it does
SHM_WAIT_S = 0.05


class ChannelError(Exception):
    """A message was refused (the text gives the switch's reason) or the endpoint cannot work."""


class PeerUnavailable(ChannelError):
    """The peer cluster's switch (or our own) has been unreachable for longer than the timeout."""

    def __init__(self, cluster: str, message: str | None = None) -> None:
        super().__init__(message or f"cluster {cluster!r} is unreachable: its switch link is down")
        self.cluster = cluster


@dataclass(eq=False)
class _Msg:
    seq: int
    data: memoryview
    parts: list[int] | None
    lane: Lane
    future: Future
    pending_frames: int = 0  # frames queued but not yet handed to ZeroMQ
    progress: float = 0.0
    rto: float = RTO_S


@dataclass(eq=False)
class _Tx:
    key: ChannelKey
    meta: bytes
    next_seq: int = 1
    unacked: dict[int, _Msg] = field(default_factory=dict)  # by seq, in order
    waiting: deque = field(default_factory=deque)  # messages not yet admitted by the window
    admitted: deque = field(default_factory=deque)  # (seq, nbytes) of messages not yet consumed
    inflight: int = 0
    acked: int = 0
    consumed: int = 0


@dataclass(eq=False)
class _Rx:
    key: ChannelKey
    expected: int = 1
    partial: dict[int, list] = field(default_factory=dict)  # seq -> [chunks, count, parts, received, regions]
    complete: dict[int, tuple] = field(default_factory=dict)
    consumed: int = 0


class _Shared:
    """State a Channel shares between the application and the I/O thread."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.ready: deque = deque()  # (bytes, parts)
        self.errors: deque = deque()


class Endpoint:
    """One worker's connection to its cluster's switch server, shared by all its channels."""

    def __init__(self, cfg: WorkerConfig, job: str, rank: int, window_bytes: int) -> None:
        self.cfg = cfg
        self.job = job
        self.rank = rank
        self.window_bytes = window_bytes
        self._closed = False
        self._io = _IOThread(self)
        self._channels: dict[tuple[str, int, str], Channel] = {}
        self._lock = threading.Lock()

    @classmethod
    def connect(cls, worker_file: str | Path | WorkerConfig, *, job: str, rank: int, timeout_s: float = 30.0,
                window_bytes: int = DEFAULT_WINDOW_BYTES) -> Endpoint:
        """Connect to the switch named in `worker_file` as rank `rank` of `job`; wait until it welcomes us."""
        cfg = worker_file if isinstance(worker_file, WorkerConfig) else load_worker_config(worker_file)
        if not isinstance(rank, int) or rank < 0:
            raise ValueError(f"rank {rank!r} must be a non-negative integer")
        if not job or not isinstance(job, str):
            raise ValueError(f"job {job!r} must be a non-empty string")
        ep = cls(cfg, job, rank, window_bytes)
        ep._io.start()
        try:
            ep._io.wait_welcome(timeout_s)
        except BaseException:
            ep.close(flush_s=0)
            raise
        return ep

    @property
    def cluster(self) -> str:
        """This worker's cluster."""
        return self.cfg.cluster

    def channel(self, peer_cluster: str, peer_rank: int, name: str) -> Channel:
        """The channel to (peer_cluster, peer_rank) called `name`; both ends use the same name."""
        with self._lock:
            k = (peer_cluster, peer_rank, name)
            ch = self._channels.get(k)
            if ch is None:
                ch = self._channels[k] = Channel(self, peer_cluster, peer_rank, name)
            return ch

    def peer_clusters(self) -> list[str]:
        """Clusters our switch has links to (as of its latest WELCOME)."""
        return sorted(self._io.peers)

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until every message sent so far is acknowledged by its receiver; False on timeout."""
        return self._io.wait_drained(timeout_s)

    def close(self, flush_s: float = 10.0) -> None:
        """Wait up to `flush_s` for unacknowledged messages to be acknowledged, then stop the I/O thread."""
        if self._closed:
            return
        self._closed = True
        if flush_s > 0:
            self._io.wait_drained(flush_s)
        self._io.stop()

    def __enter__(self) -> Endpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Channel:
    """Ordered, exactly-once message stream between this rank and one peer rank (both directions)."""

    def __init__(self, ep: Endpoint, peer_cluster: str, peer_rank: int, name: str) -> None:
        self.ep = ep
        self.peer_cluster = peer_cluster
        self.peer_rank = peer_rank
        self.name = name
        cfg = ep.cfg
        self.tx_key = ChannelKey(ep.job, cfg.account, cfg.cluster, ep.rank, peer_cluster, peer_rank, name)
        self.rx_key = ChannelKey(ep.job, cfg.account, peer_cluster, peer_rank, cfg.cluster, ep.rank, name)
        encode_meta(self.tx_key.to_meta())  # fails early on names too long for the wire
        self._shared = ep._io.register(self)
        self._codecs: dict[tuple[str, str], Any] = {}

    def send(self, data: bytes | bytearray | memoryview | Sequence[Any], lane: str = "activation") -> Future:
        """Queue `data` (bytes-like, or a sequence of bytes-like parts); the future completes once the switch has it."""
        ln = lane_of(lane)
        if isinstance(data, (bytes, bytearray, memoryview)):
            view, parts = memoryview(data).cast("B"), None
        else:
            items = [memoryview(p).cast("B") for p in data]
            parts = [len(p) for p in items]
            view = memoryview(b"".join(items)) if len(items) != 1 else items[0]
            if len(parts) > 500:  # keep the part list inside one frame's meta
                parts = None
        fut: Future = Future()
        fut.set_running_or_notify_cancel()
        if self.ep._closed:
            fut.set_exception(ChannelError("endpoint is closed"))
            return fut
        limit = self.ep._io.max_message_bytes
        if len(view) > limit:
            fut.set_exception(ChannelError(
                f"message of {len(view)} bytes exceeds the switch's link.max_message_bytes={limit}; split it"))
            return fut
        self.ep._io.submit(self, _Msg(0, view, parts, ln, fut))
        return fut

    def recv_parts(self, timeout_s: float | None = None) -> list[memoryview]:
        """Next message as its parts (as given to `send`); see `recv` for the errors."""
        data, parts = self._next(timeout_s)
        view = memoryview(data)
        if parts is None:
            return [view]
        out, off = [], 0
        for n in parts:
            out.append(view[off : off + n])
            off += n
        return out

    def recv(self, timeout_s: float | None = None) -> bytes:
        """Next message on this channel, in order; TimeoutError, PeerUnavailable or ChannelError (refusals)."""
        return self._next(timeout_s)[0]

    def _next(self, timeout_s: float | None) -> tuple[bytes, list[int] | None]:
        sh = self._shared
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with sh.cond:
            while not sh.ready and not sh.errors:
                if self.ep._closed:
                    raise ChannelError("endpoint is closed")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    down = self.ep._io.unreachable(self.peer_cluster)
                    if down is not None:
                        raise PeerUnavailable(self.peer_cluster, down)
                    raise TimeoutError(
                        f"no message on channel {self.name!r} from {self.peer_cluster}/{self.peer_rank} within {timeout_s} s")
                sh.cond.wait(left if left is None else min(left, 1.0))
            if sh.errors:
                raise sh.errors.popleft()
            item = sh.ready.popleft()
        self.ep._io.consumed(self)
        return item

    def send_tensor(self, x: Any, codec: Any = "none", lane: str = "activation") -> Future:
        """Encode `x` (numpy array or paddle.Tensor) with `codec` and send it."""
        from nebula.compress import encode_to_frames

        return self.send(encode_to_frames(self._codec(codec, "tx"), x), lane=lane)

    def recv_tensor(self, codec: Any = "none", timeout_s: float | None = None, like: str = "numpy") -> Any:
        """Receive and decode a tensor sent with `send_tensor` (the frames name their codec; a Codec instance
        given here decodes, so a stateful decoder keeps its state per channel)."""
        from nebula.compress.frames import decode_from_frames, frames_to_encoded

        parts = self.recv_parts(timeout_s)
        if isinstance(codec, str):
            return decode_from_frames(parts, like=like)
        return codec.decode(frames_to_encoded(parts, like))

    def _codec(self, codec: Any, direction: str) -> Any:
        if not isinstance(codec, str):
            return codec
        c = self._codecs.get((codec, direction))
        if c is None:
            from nebula.compress import get_codec

            c = self._codecs[(codec, direction)] = get_codec(codec)
        return c


class _IOThread:
    """The one thread that touches the ZeroMQ socket: sends by lane priority, receives, acknowledges, resends."""

    def __init__(self, ep: Endpoint) -> None:
        self.ep = ep
        cfg = ep.cfg
        try:
            public, secret = zmq.auth.load_certificate(cfg.curve_key)
        except (OSError, ValueError) as exc:
            raise ChannelError(f"cannot read the worker CURVE key {cfg.curve_key} ({exc}); check worker.yaml") from None
        if not secret:
            raise ChannelError(f"{cfg.curve_key} holds no secret key; use the worker.key_secret file")
        self.ctx = zmq.Context()
        s = self.sock = self.ctx.socket(zmq.DEALER)
        s.linger = 0
        self.address, self.transport = local_endpoint(cfg)
        if self.transport == "ipc":
            s.plain_username = public
            s.plain_password = local_password(secret.decode(), cfg.switch_curve_public_key).encode()
        else:
            s.curve_publickey = public
            s.curve_secretkey = secret
            s.curve_serverkey = cfg.switch_curve_public_key.encode()
        s.sndhwm = SNDHWM
        s.reconnect_ivl = 100
        s.reconnect_ivl_max = 2000
        self.monitor = s.get_monitor_socket(zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                                            | zmq.EVENT_HANDSHAKE_SUCCEEDED)
        s.connect(self.address)
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        self.cmds: deque = deque()
        self.lanes: tuple[deque, deque, deque, deque] = (deque(), deque(), deque(), deque())
        self.turn = 0
        self.tx: dict[int, _Tx] = {}
        self.rx: dict[int, _Rx] = {}
        self.shared: dict[int, _Shared] = {}  # by rx channel id
        self.tx_shared: dict[int, _Shared] = {}  # by tx channel id
        self.dirty: set[int] = set()
        self.welcome = threading.Event()
        self.boot = 0
        self.peers: dict[str, dict] = {}
        self.last_welcome = 0.0
        self.chunk_bytes = 256 * 1024
        self.max_message_bytes = 1 << 62
        self.fatal: BaseException | None = None
        self.refusal: BaseException | None = None
        self.running = True
        self.thread = threading.Thread(target=self._run, name=f"nebula-channel-{ep.job}-{ep.rank}", daemon=True)
        # shared memory (IPC only): the arena the switch offered and we mapped, our allocator for its upward half,
        # and downward regions we have read and will hand back
        self.want_shm = cfg.shared_memory and self.transport == "ipc"
        self.arena: Arena | None = None
        self.up_ring: Ring | None = None
        self.shm_refused = 0  # token of an offered arena we could not map (not tried again)
        self.shm_full_since: float | None = None  # the upward half has had no room since then
        self.shm_waiting = False  # the next frame waits for room in it (so: no POLLOUT wake-ups meanwhile)
        self.down_done: list[tuple[int, int]] = []  # (arena token, offset)
        self.down_done_bytes = 0
        self.release_due = 0.0
        self.hello_head = self._hello()
        self.resend_after_welcome = False

    def _hello(self) -> bytes:
        cfg, ep = self.ep.cfg, self.ep
        meta = {"job": ep.job, "rank": ep.rank, "account": cfg.account, "name": cfg.name}
        if self.want_shm:
            meta["shm"] = self.arena.token if self.arena is not None else 0
        return encode_frame(FrameType.HELLO, meta)

    # ---- called from application threads ----
    def start(self) -> None:
        self.thread.start()

    def wait_welcome(self, timeout_s: float) -> None:
        if not self.welcome.wait(timeout_s):
            if self.fatal is not None:
                raise self.fatal
            if self.refusal is not None:
                raise self.refusal
            hint = ("is its local.ipc_endpoint the ipc_endpoint in worker.yaml? (transport: tcp avoids IPC)"
                    if self.transport == "ipc" else "is switch_curve_public_key in worker.yaml the switch's key?")
            raise ChannelError(f"switch at {self.address} did not answer within {timeout_s} s; is it running, and {hint}")
        if self.fatal is not None:
            raise self.fatal

    def register(self, ch: Channel) -> _Shared:
        sh = _Shared()
        self.cmds.append(("channel", ch, sh))
        self._wake()
        return sh

    def submit(self, ch: Channel, msg: _Msg) -> None:
        self.cmds.append(("send", ch.tx_key.id, msg))
        self._wake()

    def consumed(self, ch: Channel) -> None:
        self.cmds.append(("consumed", ch.rx_key.id, None))
        self._wake()

    def unreachable(self, cluster: str) -> str | None:
        """Why `cluster` cannot be reached now, or None if its link is up."""
        if time.monotonic() - self.last_welcome > SWITCH_SILENT_S:
            return f"our switch at {self.address} has not answered for {time.monotonic() - self.last_welcome:.0f} s"
        if cluster == self.ep.cfg.cluster:
            return None
        st = self.peers.get(cluster)
        if st is None:
            return f"cluster {cluster!r} is not a peer of our switch (peers: {', '.join(self.peers) or 'none'})"
        if not st.get("up"):
            return f"the link to cluster {cluster!r} is down since {time.ctime(st.get('down_since', 0))}"
        return None

    def wait_drained(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while self.thread.is_alive():
            if not self.cmds and not any(t.unacked or t.waiting for t in list(self.tx.values())):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)
        return False

    def stop(self) -> None:
        self.running = False
        self._wake()
        self.thread.join(5.0)
        for sh in list(self.shared.values()) + list(self.tx_shared.values()):
            with sh.cond:
                sh.cond.notify_all()

    def _wake(self) -> None:
        try:
            os.write(self.wake_w, b"x")
        except BlockingIOError:  # pragma: no cover - the pipe is full, the thread is awake anyway
            pass

    # ---- the I/O thread ----
    def _run(self) -> None:
        try:
            self._loop()
        except Exception as exc:  # pragma: no cover - last resort: make the failure visible to callers
            log.exception("channel I/O thread failed")
            self.fatal = ChannelError(f"channel I/O thread failed: {exc!r}")
            self.welcome.set()
        finally:
            try:  # free our rank at the switch now, so a new endpoint of this process can take it at once
                self.sock.send(encode_frame(FrameType.BYE), zmq.NOBLOCK)
                self.sock.linger = 500
            except zmq.ZMQError:
                pass
            self.monitor.close(0)
            self.sock.close()
            self.ctx.term()
            os.close(self.wake_r)
            os.close(self.wake_w)

    def _loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        poller.register(self.wake_r, zmq.POLLIN)
        poller.register(self.monitor, zmq.POLLIN)
        sock_events = zmq.POLLIN
        next_hello = 0.0
        next_check = time.monotonic() + 1.0
        while self.running:
            now = time.monotonic()
            if now >= next_hello:
                self._send_raw(self.hello_head, b"")
                next_hello = now + HEARTBEAT_S
            if now >= next_check:
                self._check_timeouts(now)
                next_check = now + 0.5
            want = zmq.POLLIN | (zmq.POLLOUT if any(self.lanes) and not self.shm_waiting else 0)
            if want != sock_events:
                poller.modify(self.sock, want)
                sock_events = want
            until = min(next_hello, next_check)
            if self.down_done:
                until = min(until, self.release_due)
            if self.shm_waiting and self.shm_full_since is not None:
                until = min(until, self.shm_full_since + SHM_WAIT_S)
            events = dict(poller.poll(max(0.0, until - time.monotonic()) * 1000))
            if self.wake_r in events:
                try:
                    while os.read(self.wake_r, 4096):
                        pass
                except BlockingIOError:
                    pass
            if self.monitor in events:
                self._on_monitor()
            self._do_cmds()
            self._recv_all()
            self._flush_acks()
            self._flush_shm_releases()
            self._send_lanes()

    def _on_monitor(self) -> None:
        while True:
            try:
                ev = recv_monitor_message(self.monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            if ev["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                hint = ("; if it is listed, check that switch_curve_public_key in worker.yaml is this switch's key "
                        "(the IPC password is derived from it)" if self.transport == "ipc" else "")
                self.fatal = ChannelError(
                    f"switch at {self.address} refused our key (ZAP status {ev['value']}): "
                    f"ask its admin to add worker {self.ep.cfg.name!r}'s public key under local.workers{hint}")
                self.welcome.set()
            elif ev["event"] == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
                what = ("PLAIN handshake" if self.transport == "ipc" else "CURVE handshake")
                fix = ("is that endpoint the switch's local.ipc_endpoint?" if self.transport == "ipc"
                       else "switch_curve_public_key is probably wrong")
                self.fatal = ChannelError(f"{what} with {self.address} failed: {fix}")
                self.welcome.set()

    def _do_cmds(self) -> None:
        while self.cmds:
            kind, a, b = self.cmds.popleft()
            if kind == "send":
                self._admit_new(self.tx[a], b)
            elif kind == "consumed":
                self.rx[a].consumed += 1
                self.dirty.add(a)
            elif kind == "channel":
                ch, sh = a, b
                tx = self.tx.get(ch.tx_key.id)
                if tx is None:
                    self.tx[ch.tx_key.id] = _Tx(ch.tx_key, encode_meta(ch.tx_key.to_meta()))
                self.tx_shared[ch.tx_key.id] = sh
                rx = self.rx.get(ch.rx_key.id)
                if rx is None:
                    self.rx[ch.rx_key.id] = _Rx(ch.rx_key)
                old = self.shared.get(ch.rx_key.id)
                if old is not None:  # messages that arrived before the application opened the channel
                    with old.cond:
                        sh.ready.extend(old.ready)
                        sh.errors.extend(old.errors)
                self.shared[ch.rx_key.id] = sh

    # sending
    def _admit_new(self, tx: _Tx, msg: _Msg) -> None:
        msg.seq = tx.next_seq
        tx.next_seq += 1
        tx.unacked[msg.seq] = msg
        tx.waiting.append(msg)
        self._admit(tx)

    def _admit(self, tx: _Tx) -> None:
        while tx.waiting:
            msg = tx.waiting[0]
            n = len(msg.data)
            if tx.inflight and tx.inflight + n > self.ep.window_bytes:
                return
            tx.waiting.popleft()
            tx.admitted.append((msg.seq, n))
            tx.inflight += n
            self._queue_msg(tx, msg)

    def _queue_msg(self, tx: _Tx, msg: _Msg) -> None:
        total = len(msg.data)
        count = max(1, math.ceil(total / self.chunk_bytes))
        size = math.ceil(total / count) if total else 0
        q = self.lanes[msg.lane]
        for i in range(count):
            payload = msg.data[i * size : (i + 1) * size]
            meta = tx.meta
            if i == 0 and msg.parts is not None:
                meta = encode_meta({**tx.key.to_meta(), "parts": msg.parts})
            head = encode_frame(FrameType.DATA, meta, payload, lane=msg.lane, channel_id=tx.key.id, seq=msg.seq,
                                chunk_index=i, chunk_count=count, total_len=total)
            q.append((head, payload, msg))
        msg.pending_frames += count
        msg.progress = time.monotonic()
        # a large message may wait long behind others on a slow link: the fallback timer grows with its size
        msg.rto = max(msg.rto, RTO_S + total / RTO_BYTES_PER_S)

    def _send_raw(self, head: bytes, payload: Any) -> bool:
        n = len(payload)
        if (SHM_MIN_BYTES <= n and self.up_ring is not None and n <= self.up_ring.size
                and self.sock.get(zmq.EVENTS) & zmq.POLLOUT):
            off = self.up_ring.alloc(n)
            if off is None:  # the switch still holds the arena: wait for a release a while, then go inline
                now = time.monotonic()
                if self.shm_full_since is None:
                    self.shm_full_since = now
                if now - self.shm_full_since < SHM_WAIT_S:
                    self.shm_waiting = True
                    return False
            else:
                self.arena.up[off : off + n] = payload
                try:
                    self.sock.send_multipart((head, SHM_TAG, pack_desc(self.arena.token, off, n)), zmq.NOBLOCK)
                    return True
                except zmq.Again:
                    self.up_ring.free(off)
                    return False
        try:
            if n:
                self.sock.send_multipart((head, payload), zmq.NOBLOCK, copy=len(payload) < 65536)
            else:
                self.sock.send(head, zmq.NOBLOCK)
            return True
        except zmq.Again:
            return False

    def _send_lanes(self) -> None:
        lanes = self.lanes
        self.shm_waiting = False
        while True:
            if lanes[0]:
                q = lanes[0]
            elif lanes[1] or lanes[2]:
                if lanes[1] and lanes[2]:
                    q = lanes[1 + self.turn]
                    self.turn ^= 1
                else:
                    q = lanes[1] if lanes[1] else lanes[2]
            elif lanes[3]:
                q = lanes[3]
            else:
                return
            head, payload, msg = q[0]
            if not self._send_raw(head, payload):
                return
            q.popleft()
            if msg is not None:
                msg.pending_frames -= 1
                if msg.pending_frames == 0:
                    msg.progress = time.monotonic()
                    if not msg.future.done():
                        msg.future.set_result(None)

    def _resend(self, tx: _Tx, why: str) -> None:
        admitted = {seq for seq, _ in tx.admitted}
        count = 0
        for msg in tx.unacked.values():
            if msg.pending_frames == 0 and msg.seq in admitted:
                self._queue_msg(tx, msg)
                count += 1
        if count:
            log.info("resending %d messages on %s (%s)", count, tx.key.name, why)

    def _check_timeouts(self, now: float) -> None:
        for tx in self.tx.values():
            admitted = None
            for msg in tx.unacked.values():
                if msg.pending_frames == 0 and now - msg.progress > msg.rto:
                    if admitted is None:
                        admitted = {seq for seq, _ in tx.admitted}
                    if msg.seq in admitted:
                        log.info("no acknowledgement of %s #%d for %.0f s: sending it again", tx.key.name, msg.seq,
                                 now - msg.progress)
                        msg.rto = max(msg.rto, min(msg.rto * 2, RTO_MAX_S))
                        self._queue_msg(tx, msg)

    # receiving
    def _recv_all(self) -> None:
        sock = self.sock
        while True:
            try:
                parts = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            shm_off = None
            if len(parts) == 3 and parts[1].bytes == SHM_TAG:
                try:
                    payload, shm_off = self._shm_payload(parts[2].buffer)
                except WireError as exc:
                    log.warning("switch sent a bad shared-memory descriptor (%s); ignored", exc)
                    continue
            elif len(parts) in (1, 2):
                payload = parts[1].buffer if len(parts) == 2 else b""
            else:
                log.warning("switch sent a message of %d parts; ignored", len(parts))
                continue
            try:
                frame = decode_frame(parts[0].buffer, payload)
            except WireError as exc:
                log.warning("switch sent a malformed frame (%s); ignored", exc)
                self._shm_done(shm_off)
                continue
            t = frame.type
            if t == FrameType.DATA:
                self._on_data(frame, payload, shm_off)
                continue
            self._shm_done(shm_off)
            if t == FrameType.ACK:
                self._on_ack(frame)
            elif t == FrameType.WELCOME:
                self._on_welcome(frame.meta)
            elif t == FrameType.ERROR:
                self._on_error(frame)
            elif t == FrameType.SHM_RELEASE:
                if self.arena is not None and frame.meta["token"] == self.arena.token:
                    for off in frame.meta["offsets"]:
                        self.up_ring.free(off)
                    self.shm_full_since = None

    # shared memory
    def _shm_payload(self, desc: memoryview) -> tuple[memoryview, tuple[int, int, int]]:
        """A downward payload in the arena, and its (token, offset, length), to hand back once it is read."""
        token, off, n = unpack_desc(desc)
        if self.arena is None or token != self.arena.token:
            raise WireError("bad_shm", f"descriptor names arena {token:x}, which this worker has not mapped")
        return self.arena.region(self.arena.down, off, n), (token, off, n)

    def _shm_done(self, region: tuple[int, int, int] | None) -> None:
        """We no longer need a downward region: the switch may reuse it (told in the next release frame)."""
        if region is not None:
            if not self.down_done:
                self.release_due = time.monotonic() + RELEASE_DELAY_S
            self.down_done.append(region[:2])
            self.down_done_bytes += region[2]

    def _flush_shm_releases(self) -> None:
        if not self.down_done:
            return
        token = self.arena.token if self.arena is not None else 0
        if token and not release_now(self.down_done_bytes, self.arena.half) and time.monotonic() < self.release_due:
            return
        offsets = [off for t, off in self.down_done if t == token]  # (a replaced arena's regions went with it)
        for i in range(0, len(offsets), RELEASE_BATCH):
            head = encode_frame(FrameType.SHM_RELEASE, {"token": token, "offsets": offsets[i : i + RELEASE_BATCH]})
            self.lanes[Lane.CONTROL].append((head, b"", None))
        self.down_done, self.down_done_bytes = [], 0

    def _take_arena(self, offer: Any) -> None:
        """Map the arena a WELCOME offers, unless it is the one we have (or one we could not map)."""
        try:
            pid, fd, token, half = (int(offer[k]) for k in ("pid", "fd", "token", "bytes"))
        except (TypeError, KeyError, ValueError):
            log.warning("switch offered shared memory in a form this worker does not understand: %r", offer)
            return
        if token in (self.shm_refused, self.arena.token if self.arena is not None else 0):
            return
        try:
            arena = Arena.open(pid, fd, token, half)
        except OSError as exc:
            log.warning("cannot map the switch's shared memory (%s); payloads go through the socket", exc)
            self.shm_refused = token
            return
        # regions of the old arena are forgotten with it: frames still naming it are dropped by the switch and
        # sent again, like everything else after a switch restart
        self.arena, self.up_ring, self.down_done, self.shm_full_since = arena, Ring(half), [], None
        self.down_done_bytes = 0
        self.hello_head = self._hello()
        self._send_raw(self.hello_head, b"")  # tells the switch we mapped it, so it may send downwards through it

    def _on_welcome(self, meta: dict) -> None:
        first = not self.welcome.is_set()
        self.last_welcome = time.monotonic()
        if self.want_shm and "shm" in meta:
            self._take_arena(meta["shm"])
        self.chunk_bytes = meta["chunk_bytes"]
        self.max_message_bytes = meta["max_message_bytes"]
        restarted = self.boot not in (0, meta["boot"])
        self.boot = meta["boot"]
        old_peers, self.peers = self.peers, meta["peers"]
        for tx in self.tx.values():
            c = tx.key.dst_cluster
            before = old_peers.get(c, {}).get("epoch", 0)
            after = self.peers.get(c, {}).get("epoch", 0)
            if restarted or self.resend_after_welcome:
                self._resend(tx, "our switch restarted")
            elif before not in (0, after):
                self._resend(tx, f"the switch of {c} restarted")
        self.resend_after_welcome = False
        if restarted:
            for rid in self.rx:
                self.dirty.add(rid)
        if first:
            self.welcome.set()

    def _on_error(self, frame: Any) -> None:
        code, message = frame.meta["code"], frame.meta["message"]
        if code == "no_hello":
            # our switch restarted and does not know us yet: introduce ourselves and resend after its welcome
            self._send_raw(self.hello_head, b"")
            self.resend_after_welcome = True
            return
        ch = frame.meta.get("channel")
        err = ChannelError(f"{code}: {message}")
        if ch is None:
            log.warning("switch refused a frame: %s: %s", code, message)
            if code == "rank_taken":
                # retried by the heartbeat: the other connection may be a dead predecessor of this process
                self.refusal = err
            elif not self.welcome.is_set():
                self.fatal = err
                self.welcome.set()
            return
        key = ChannelKey.from_meta(ch)
        tx = self.tx.get(key.id)
        if tx is None:
            log.warning("switch refused a frame of channel %s: %s: %s", key.name, code, message)
            return
        msg = tx.unacked.pop(frame.header.seq, None)
        if msg is not None:
            self._drop_from_window(tx, msg.seq)
            if not msg.future.done():
                msg.future.set_exception(err)
        sh = self.tx_shared.get(key.id)
        if sh is not None:
            with sh.cond:
                sh.errors.append(err)
                sh.cond.notify_all()

    def _drop_from_window(self, tx: _Tx, seq: int) -> None:
        for i, (s, n) in enumerate(tx.admitted):
            if s == seq:
                del tx.admitted[i]
                tx.inflight -= n
                break
        self._admit(tx)

    def _on_ack(self, frame: Any) -> None:
        tx = self.tx.get(frame.header.channel_id)
        if tx is None:
            return
        recv_seq, consumed = frame.header.seq, frame.meta["consumed"]
        progressed = False
        if recv_seq > tx.acked:
            for seq in range(tx.acked + 1, recv_seq + 1):
                msg = tx.unacked.pop(seq, None)
                if msg is not None and not msg.future.done():
                    msg.future.set_result(None)
            tx.acked = recv_seq
            progressed = True
        if consumed > tx.consumed:
            tx.consumed = consumed
            while tx.admitted and tx.admitted[0][0] <= consumed:
                tx.inflight -= tx.admitted.popleft()[1]
            self._admit(tx)
        if progressed:
            now = time.monotonic()
            for msg in tx.unacked.values():
                msg.progress = max(msg.progress, now)

    def _on_data(self, frame: Any, payload: Any, shm_off: tuple[int, int] | None) -> None:
        h = frame.header
        rx = self.rx.get(h.channel_id)
        if rx is None:
            key = frame.key()
            if key.dst_rank != self.ep.rank or key.dst_cluster != self.ep.cfg.cluster or key.job != self.ep.job:
                log.warning("dropping a frame addressed to %s", key)
                self._shm_done(shm_off)
                return
            rx = self.rx[h.channel_id] = _Rx(key)
            self.shared.setdefault(h.channel_id, _Shared())
        seq = h.seq
        if seq < rx.expected or seq in rx.complete:
            self.dirty.add(h.channel_id)
            self._shm_done(shm_off)
            return  # a duplicate: acknowledged again, delivered once
        entry = rx.partial.get(seq)
        if entry is None:
            if h.chunk_count > 1 and h.total_len > self.ep.window_bytes * 4 + (1 << 30):
                log.warning("dropping a message of %d bytes: larger than this endpoint accepts", h.total_len)
                self._shm_done(shm_off)
                return
            # [chunks by index, count, parts, received, shared-memory regions to hand back once joined]
            entry = rx.partial[seq] = [[None] * h.chunk_count, h.chunk_count, None, 0, []]
        chunks = entry[0]
        if h.chunk_count != entry[1] or chunks[h.chunk_index] is not None:
            self._shm_done(shm_off)
            return
        chunks[h.chunk_index] = payload
        if shm_off is not None:
            entry[4].append(shm_off)
        entry[3] += 1
        if h.chunk_index == 0 and "parts" in frame.meta:
            entry[2] = frame.meta["parts"]
        if entry[3] < entry[1]:
            return
        del rx.partial[seq]
        self.dirty.add(h.channel_id)  # acknowledged per complete message, not per chunk
        data = bytes(chunks[0]) if entry[1] == 1 else b"".join(chunks)
        for off in entry[4]:  # copied out: the arena's regions may be reused
            self._shm_done(off)
        rx.complete[seq] = (data, entry[2])
        if seq != rx.expected:
            return
        sh = self.shared[h.channel_id]
        with sh.cond:
            while rx.expected in rx.complete:
                sh.ready.append(rx.complete.pop(rx.expected))
                rx.expected += 1
            sh.cond.notify_all()

    def _flush_acks(self) -> None:
        if not self.dirty:
            return
        for cid in self.dirty:
            rx = self.rx.get(cid)
            if rx is None:
                continue
            recv_seq = rx.expected - 1
            head = encode_frame(FrameType.ACK, {**rx.key.to_meta(), "consumed": rx.consumed}, channel_id=cid,
                                seq=recv_seq)
            self.lanes[Lane.CONTROL].append((head, b"", None))
        self.dirty.clear()
