"""The one thread of an Endpoint that touches its ZeroMQ socket: sends by lane priority, receives, acknowledges,
resends, and drives each channel's delivery state (`nebula.channel.delivery`) and the shared-memory arena."""
from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol

import zmq
from zmq.utils.monitor import recv_monitor_message

from nebula.channel.arena import SHM_WAIT_S, ArenaClient, Region
from nebula.channel.connection import connect, handshake_failure, silent_switch
from nebula.channel.delivery import Delivered, OutMessage, Receiver, Sender
from nebula.channel.errors import ChannelError, SwitchRefused
from nebula.channel.outlet import Outlet
from nebula.channel.throughput import ThroughputMeter
from nebula.config.worker import WorkerConfig
from nebula.wire import ChannelKey, Dispatcher, FrameType, WireError, decode_frame, encode_frame
from nebula.wire.shm import SHM_TAG

__all__ = ["HEARTBEAT_S", "SWITCH_SILENT_S", "Inbox", "IOThread"]

log = logging.getLogger(__name__)

BYE_WAIT_S = 1.0  # how long a closing endpoint waits for its switch to answer BYE
HEARTBEAT_S = 1.0  # HELLO (and the switch's WELCOME answer) this often
SWITCH_SILENT_S = 5.0  # no WELCOME for this long: our own switch is unreachable
MAX_HEARTBEAT_S = 2.5  # below the switch's RANK_HELD_S (3 s), and two missed WELCOMEs fit in SWITCH_SILENT_S


@dataclass(eq=False)
class Inbox:
    """What a channel's application side and the I/O thread share: delivered messages and refusals."""

    cond: threading.Condition = field(default_factory=threading.Condition)
    ready: deque[Delivered] = field(default_factory=deque)
    errors: deque[BaseException] = field(default_factory=deque)


class ChannelKeys(Protocol):
    """What the I/O thread needs of a channel: its two stream keys."""

    tx_key: ChannelKey
    rx_key: ChannelKey


class IOThread:
    """Owns the socket and its outlet (the lanes), every channel's Sender and Receiver, and the arena client."""

    def __init__(self, cfg: WorkerConfig, job: str, rank: int, window_bytes: int,
                 stages: Mapping[str, str] | None = None, heartbeat_s: float = HEARTBEAT_S) -> None:
        if not 0 < heartbeat_s <= MAX_HEARTBEAT_S:
            raise ValueError(f"heartbeat_s={heartbeat_s} must be in (0, {MAX_HEARTBEAT_S}]: the switch hands a rank "
                             "silent for 3 s to another connection")
        self.cfg, self.job, self.rank, self.window_bytes = cfg, job, rank, window_bytes
        # this start's incarnation (nebula.channel.delivery): our switch gives it in its first WELCOME and checks
        # it on every frame we send; no channel carries a message before then
        self.inc = 0
        self.stages = dict(stages) if stages is not None else None
        self.heartbeat_s = heartbeat_s
        self.ctx, self.sock, self.monitor, self.address, self.transport = connect(cfg)
        self.wake_r, self.wake_w = os.pipe()
        self.wake_pending = False  # a wake-up byte is on its way: commands queued meanwhile need no other
        self.unacked = True  # some message may wait for its acknowledgement: check timeouts every 0.5 s
        os.set_blocking(self.wake_r, False)
        self.cmds: deque = deque()
        self.tx: dict[int, Sender] = {}
        self.meters: dict[str, ThroughputMeter] = {}  # per peer cluster: its link's throughput, from acknowledgements
        self.rx: dict[int, Receiver] = {}
        self.inboxes: dict[int, Inbox] = {}  # by rx channel id
        self.tx_inboxes: dict[int, Inbox] = {}  # by tx channel id
        self.dirty: set[int] = set()  # rx channels that owe an ACK
        # Endpoint.watch: rx channels that received messages, oldest first, so a reader of many channels looks
        # only at those (None: not recorded)
        self.watched: dict[int, ChannelKey] | None = None
        self.watch_cond = threading.Condition()
        self.welcome = threading.Event()
        self.boot = 0
        self.peers: dict[str, dict] = {}
        self.last_welcome = 0.0
        self.chunk_bytes = 256 * 1024
        self.max_message_bytes = 1 << 62
        self.fatal: BaseException | None = None
        self.refusal: BaseException | None = None
        self.bad_acks = 0  # acknowledgements refused as claiming more than was sent (a forged or broken peer)
        self.running = True
        self.thread = threading.Thread(target=self._run, name=f"nebula-channel-{job}-{rank}", daemon=True)
        self.shm = ArenaClient(cfg.shared_memory and self.transport == "ipc")
        self.out = Outlet(self.sock, self.shm)
        self.hello_head = self._hello()
        self.resend_after_welcome = False
        self.on_frame = Dispatcher("a worker's connection to its switch", {
            FrameType.DATA: self._on_data, FrameType.ACK: self._on_ack, FrameType.WELCOME: self._on_welcome,
            FrameType.ERROR: self._on_error, FrameType.SHM_RELEASE: self._on_shm_release})

    def _hello(self) -> bytes:
        cfg = self.cfg
        meta = {"job": self.job, "rank": self.rank, "account": cfg.account, "name": cfg.name}
        if self.inc:
            meta["inc"] = self.inc
        if self.shm.wanted:
            meta["shm"] = self.shm.token
        if self.stages is not None:
            meta["stages"] = self.stages
        return encode_frame(FrameType.HELLO, meta)

    # ---- called from application threads ----
    def start(self) -> None:
        """Start the thread."""
        self.thread.start()

    def wait_welcome(self, timeout_s: float) -> None:
        """Block until the switch welcomed us; ChannelError naming the likely cause if it does not."""
        if not self.welcome.wait(timeout_s):
            raise self.fatal or self.refusal or silent_switch(self.address, self.transport, timeout_s)
        if self.fatal is not None:
            raise self.fatal

    def register(self, ch: ChannelKeys) -> Inbox:
        """Open a channel's streams; returns the inbox its application side reads."""
        inbox = Inbox()
        self._command("channel", ch, inbox)
        return inbox

    def submit(self, ch: ChannelKeys, msg: OutMessage) -> None:
        """Queue a message on the channel's sending stream."""
        self._command("send", ch.tx_key.id, msg)

    def consumed(self, ch: ChannelKeys) -> None:
        """The application took a message off the channel's receiving stream."""
        self._command("consumed", ch.rx_key.id, None)

    def watch(self) -> None:
        """Start recording the channels that receive messages (those already holding some included)."""
        self._command("watch", None, None)

    def ready(self, timeout_s: float) -> list[ChannelKey]:
        """Receiving keys of the channels that got messages since the last call, oldest first; [] on timeout."""
        deadline = time.monotonic() + timeout_s
        with self.watch_cond:
            while not self.watched:
                left = deadline - time.monotonic()
                if left <= 0 or not self.running:
                    return []
                self.watch_cond.wait(min(left, 1.0))
            out = list(self.watched.values())
            self.watched.clear()
        return out

    def _command(self, kind: str, a: Any, b: Any) -> None:
        self.cmds.append((kind, a, b))
        if not self.wake_pending:  # one wake-up for a burst of commands (a combiner's thousand tasks), not one each
            self.wake_pending = True
            self._wake()

    def _wake(self) -> None:
        try:
            os.write(self.wake_w, b"x")
        except BlockingIOError:  # pragma: no cover - the pipe is full, the thread is awake anyway
            pass

    def unreachable(self, cluster: str) -> str | None:
        """Why `cluster` cannot be reached now, or None if its link is up."""
        if time.monotonic() - self.last_welcome > SWITCH_SILENT_S:
            return f"our switch at {self.address} has not answered for {time.monotonic() - self.last_welcome:.0f} s"
        if cluster == self.cfg.cluster:
            return None
        st = self.peers.get(cluster)
        if st is None:
            return f"cluster {cluster!r} is not a peer of our switch (peers: {', '.join(self.peers) or 'none'})"
        if not st.get("up"):
            return f"the link to cluster {cluster!r} is down since {time.ctime(st.get('down_since', 0))}"
        return None

    def wait_drained(self, timeout_s: float) -> bool:
        """Wait until every message sent so far is acknowledged; False on timeout or a stopped thread."""
        deadline = time.monotonic() + timeout_s
        while self.thread.is_alive():
            if not self.cmds and all(t.idle for t in list(self.tx.values())):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)
        return False

    def stop(self) -> None:
        """Stop the thread (it says BYE to the switch) and wake every reader."""
        self.running = False
        self._wake()
        self.thread.join(5.0)
        for inbox in list(self.inboxes.values()) + list(self.tx_inboxes.values()):
            with inbox.cond:
                inbox.cond.notify_all()

    # ---- the I/O thread ----
    def _run(self) -> None:
        try:
            self._loop()
        except Exception as exc:  # pragma: no cover - last resort: make the failure visible to callers
            log.exception("channel I/O thread failed")
            self.fatal = ChannelError(f"channel I/O thread failed: {exc!r}")
            self.welcome.set()
        finally:
            if self.fatal is None:
                self._say_goodbye()
            try:  # free our rank at the switch now, so a new endpoint of this process can take it at once
                self.sock.send(encode_frame(FrameType.BYE), zmq.NOBLOCK)
                if self.fatal is None:
                    self._await_bye(BYE_WAIT_S)
                self.sock.linger = 500
            except zmq.ZMQError:
                pass
            self.monitor.close(0)
            self.sock.close()
            self.ctx.term()
            os.close(self.wake_r)
            os.close(self.wake_w)

    def _say_goodbye(self, within_s: float = 1.0) -> None:
        """Before BYE: take the commands still queued and send the acknowledgements they owe. A receiver that
        consumed its last messages and closed at once would otherwise leave their senders waiting for ever."""
        try:
            self._do_cmds()
            self._flush_acks()
            deadline = time.monotonic() + within_s
            self.out.drain()
            while self.out.pending and time.monotonic() < deadline:
                self.sock.poll(10, zmq.POLLOUT)
                self.out.drain()
        except zmq.ZMQError:  # the socket is going anyway: nothing more to say
            pass

    def _await_bye(self, within_s: float) -> None:
        """Wait, at most `within_s`, for the switch's answer to our BYE, which says it has read everything this
        connection sent before it, our last acknowledgements included. Closing at once could lose them: a switch
        that writes to a connection already closed under it (a WELCOME, a frame for us) ends that connection
        without reading what it still held unread, and the senders of our last messages wait for ever."""
        deadline = time.monotonic() + within_s
        while (left := deadline - time.monotonic()) > 0 and self.sock.poll(left * 1000, zmq.POLLIN):
            parts = self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
            try:
                if decode_frame(parts[0].buffer, b"").type == FrameType.BYE:
                    return
            except WireError:  # (a frame with a payload, still coming in for us: unread now)
                continue

    def _loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        poller.register(self.wake_r, zmq.POLLIN)
        poller.register(self.monitor, zmq.POLLIN)
        sock_events = zmq.POLLIN
        next_hello = 0.0
        next_check = time.monotonic() + 1.0
        shm = self.shm
        while self.running:
            now = time.monotonic()
            if now >= next_hello:
                self.out.send_now(self.hello_head, b"")
                next_hello = now + self.heartbeat_s
            if now >= next_check:
                self._check_timeouts(now)
                next_check = now + 0.5
            want = zmq.POLLIN | (zmq.POLLOUT if self.out.pending else 0)
            if want != sock_events:
                poller.modify(self.sock, want)
                sock_events = want
            # an idle endpoint (nothing unacknowledged) wakes only to say HELLO: a thousand idle clients of one
            # machine do not spin on timers that have nothing to check
            until = min(next_hello, next_check) if self.unacked else next_hello
            if shm.release_due is not None:
                until = min(until, shm.release_due)
            if shm.waiting and shm.full_since is not None:
                until = min(until, shm.full_since + SHM_WAIT_S)
            events = dict(poller.poll(max(0.0, until - time.monotonic()) * 1000))
            if self.wake_r in events:
                try:
                    while os.read(self.wake_r, 4096):
                        pass
                except BlockingIOError:
                    pass
            if self.monitor in events:
                self._on_monitor()
            self.wake_pending = False  # before taking the commands: one queued after this wakes us again
            self._do_cmds()
            self._recv_all()
            self._flush_acks()
            for head in shm.release_frames():
                self.out.control(head)
            self.out.drain()

    def _on_monitor(self) -> None:
        while True:
            try:
                ev = recv_monitor_message(self.monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            err = handshake_failure(ev, self.cfg, self.address, self.transport)
            if err is not None:
                self.fatal = err
                self.welcome.set()

    def _do_cmds(self) -> None:
        while self.cmds:
            kind, a, b = self.cmds.popleft()
            if kind == "send":
                self.unacked = True  # (until the next check finds every message acknowledged)
                tx = self.tx[a]
                self._queue(tx, tx.submit(b))
            elif kind == "consumed":
                self.rx[a].consume()
                self.dirty.add(a)
            elif kind == "channel":
                ch, inbox = a, b
                if ch.tx_key.id not in self.tx:
                    tx = self.tx[ch.tx_key.id] = Sender(ch.tx_key, self.window_bytes, self.inc)
                    tx.meter = self.meters.setdefault(ch.tx_key.dst_cluster, ThroughputMeter())
                self.tx_inboxes[ch.tx_key.id] = inbox
                if ch.rx_key.id not in self.rx:
                    self.rx[ch.rx_key.id] = Receiver(ch.rx_key, self.inc)
                old = self.inboxes.get(ch.rx_key.id)
                if old is not None:  # messages that arrived before the application opened the channel
                    with old.cond:
                        moved = list(old.ready), list(old.errors)
                    with inbox.cond:  # a reader may already wait on the new inbox: wake it
                        inbox.ready.extend(moved[0])
                        inbox.errors.extend(moved[1])
                        inbox.cond.notify_all()
                self.inboxes[ch.rx_key.id] = inbox
            elif kind == "watch":
                with self.watch_cond:
                    if self.watched is None:
                        self.watched = {cid: self.rx[cid].key for cid, box in self.inboxes.items()
                                        if box.ready and cid in self.rx}
                        self.watch_cond.notify_all()

    # sending
    def _queue(self, tx: Sender, msgs: list[OutMessage]) -> None:
        now = time.monotonic()
        for msg in msgs:
            self.out.push(msg.lane, tx.frames(msg, self.chunk_bytes, now))

    def _resend(self, tx: Sender, why: str) -> None:
        msgs = tx.resendable()
        if msgs:
            self._queue(tx, msgs)
            log.info("resending %d messages on %s (%s)", len(msgs), tx.key.name, why)

    def _check_timeouts(self, now: float) -> None:
        self.unacked = False
        for tx in self.tx.values():
            self.unacked = self.unacked or not tx.idle
            for msg in tx.timed_out(now):
                log.info("no acknowledgement of %s #%d for %.0f s: sending it again", tx.key.name, msg.seq,
                         tx.stalled_s(msg, now))
                self._queue(tx, [msg])

    # receiving
    def _recv_all(self) -> None:
        sock, shm = self.sock, self.shm
        while True:
            try:
                parts = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            region = None
            if len(parts) == 3 and parts[1].bytes == SHM_TAG:
                try:
                    payload, region = shm.payload(parts[2].buffer)
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
                shm.release(region)
                continue
            try:
                self.on_frame(frame, payload, region)
            except WireError as exc:  # a frame type workers do not take, or meta its handler cannot use
                log.warning("switch sent a frame this worker cannot use (%s); ignored", exc)
                shm.release(region)

    def _on_shm_release(self, frame: Any, *_: Any) -> None:
        self.shm.on_release(frame.meta)

    def _on_welcome(self, frame: Any, *_: Any) -> None:
        meta = frame.meta
        first = not self.welcome.is_set()
        self.last_welcome = time.monotonic()
        inc = meta.get("inc", 0)
        if not self.inc:
            if not inc:
                self.fatal = ChannelError(f"our switch at {self.address} gave this worker no incarnation in its "
                                          "WELCOME; it runs an older Nebula: upgrade it")
                self.welcome.set()
                return
            self.inc = inc
            self.hello_head = self._hello()
        elif inc and inc != self.inc:
            log.warning("our switch names incarnation %d for us, but we are %d; ignored", inc, self.inc)
        if self.shm.wanted and "shm" in meta and self.shm.take(meta["shm"]):
            self.hello_head = self._hello()
            self.out.send_now(self.hello_head, b"")  # tells the switch we mapped it, so it may send downwards through it
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
            self.dirty.update(self.rx)
        if first:
            self.welcome.set()

    def _on_error(self, frame: Any, *_: Any) -> None:
        code, message = frame.meta["code"], frame.meta["message"]
        if code == "no_hello":
            # our switch restarted and does not know us yet: introduce ourselves and resend after its welcome
            self.out.send_now(self.hello_head, b"")
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
                self.fatal = SwitchRefused(str(err))
                self.welcome.set()
            return
        key = ChannelKey.from_meta(ch)
        tx = self.tx.get(key.id)
        if tx is None:
            log.warning("switch refused a frame of channel %s: %s: %s", key.name, code, message)
            return
        self._queue(tx, tx.on_refused(frame.header.seq, err))
        inbox = self.tx_inboxes.get(key.id)
        if inbox is not None:
            with inbox.cond:
                inbox.errors.append(err)
                inbox.cond.notify_all()

    def _on_ack(self, frame: Any, *_: Any) -> None:
        tx = self.tx.get(frame.header.channel_id)
        if tx is None or not tx.ours(frame.meta):  # (an acknowledgement a predecessor of ours earned is not)
            return
        seq, consumed = frame.header.seq, frame.meta["consumed"]
        if tx.relearn:
            if seq or consumed:
                log.warning("channel %r: an acknowledgement names a new start of %s/%d with messages it cannot "
                            "have; ignored", tx.key.name, tx.key.dst_cluster, tx.key.dst_rank)
                return
            msgs = tx.restart_stream()
            log.info("channel %r: %s/%d restarted; sending again, from #1, the %d messages it had not consumed",
                     tx.key.name, tx.key.dst_cluster, tx.key.dst_rank, len(tx.unacked))
            self._queue(tx, msgs)
            return
        why = tx.ack_refusal(seq, consumed)
        if why is not None:
            self.bad_acks += 1
            if self.bad_acks in (1, 100, 10000):
                log.warning("channel %r: refused %d acknowledgement(s) from %s/%d; the latest: %s", tx.key.name,
                            self.bad_acks, tx.key.dst_cluster, tx.key.dst_rank, why)
            return
        self._queue(tx, tx.on_ack(seq, consumed, time.monotonic()))

    def _on_data(self, frame: Any, payload: Any, region: Region | None) -> None:
        h = frame.header
        if not self.inc:  # (our switch welcomes us before it hands us any message)
            self.shm.release(region)
            return
        rx = self.rx.get(h.channel_id)
        if rx is None:
            key = frame.key()
            if key.dst_rank != self.rank or key.dst_cluster != self.cfg.cluster or key.job != self.job:
                log.warning("dropping a frame addressed to %s", key)
                self.shm.release(region)
                return
            rx = self.rx[h.channel_id] = Receiver(key, self.inc)
            self.inboxes.setdefault(h.channel_id, Inbox())
        stale = rx.stale
        out = rx.on_chunk(h, payload, frame.meta.get("parts"), self.max_message_bytes, region, frame.meta)
        if rx.stale != stale and rx.stale in (1, 100, 10000):
            log.warning("channel %r from %s/%d: dropped %d message chunks sent by or to an earlier start of a rank "
                        "(a switch kept them across the restart)", rx.key.name, rx.key.src_cluster, rx.key.src_rank,
                        rx.stale)
        for r in out.release:
            self.shm.release(r)
        if out.ack:
            self.dirty.add(h.channel_id)
        if out.refused is not None:
            log.warning("%s", out.refused)
        if out.ready:
            inbox = self.inboxes[h.channel_id]
            with inbox.cond:
                inbox.ready.extend(out.ready)
                inbox.cond.notify_all()
            if self.watched is not None:
                with self.watch_cond:
                    self.watched.setdefault(h.channel_id, rx.key)
                    self.watch_cond.notify_all()

    def _flush_acks(self) -> None:
        if not self.dirty:
            return
        for cid in self.dirty:
            rx = self.rx.get(cid)
            if rx is None:
                continue
            recv_seq, consumed = rx.ack_state()
            meta = {**rx.key.to_meta(), **rx.ack_meta(), "consumed": consumed}
            head = encode_frame(FrameType.ACK, meta, channel_id=cid, seq=recv_seq)
            self.out.control(head)
        self.dirty.clear()
