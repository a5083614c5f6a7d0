"""The one thread of an Endpoint that touches its ZeroMQ socket: takes the application's commands, sends by lane
priority, receives, and hands frames to the channels (`nebula.channel.streams`) and to what it knows of its
switch (`nebula.channel.switchview`)."""
from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections import deque
from typing import Mapping

import zmq
from zmq.utils.monitor import recv_monitor_message

from nebula.channel.arena import SHM_WAIT_S, ArenaClient
from nebula.channel.closing import close_connection, say_goodbye
from nebula.channel.commands import Command, OpenChannel, Watch
from nebula.channel.connection import connect, handshake_failure, poll_ms, silent_switch
from nebula.channel.delivery import OutMessage
from nebula.channel.sender import TRANSIT_BYTES
from nebula.channel.errors import ChannelError
from nebula.channel.outlet import Outlet
from nebula.channel.streams import ChannelKeys, Inbox, Streams
from nebula.channel.switchview import SWITCH_SILENT_S, SwitchView
from nebula.config.worker import WorkerConfig
from nebula.channel.inlet import receive_all
from nebula.wire import ChannelKey, Dispatcher, FrameType

__all__ = ["HEARTBEAT_S", "SWITCH_SILENT_S", "Inbox", "IOThread"]

log = logging.getLogger(__name__)

HEARTBEAT_S = 1.0  # HELLO (and the switch's WELCOME answer) this often
MAX_HEARTBEAT_S = 2.5  # below the switch's RANK_HELD_S (3 s), and two missed WELCOMEs fit in SWITCH_SILENT_S
# a predecessor killed without a word holds its rank at the switch for RANK_HELD_S (3 s) after its last HELLO; our
# HELLOs keep asking, so a relaunched rank is welcomed within this however short its own timeout
RANK_TAKEN_WAIT_S = 3.0 + MAX_HEARTBEAT_S + 1.0


class IOThread:
    """Owns the socket, its outlet (the lanes), the channels' streams and the arena client."""

    def __init__(self, cfg: WorkerConfig, job: str, rank: int, window_bytes: int,
                 stages: Mapping[str, str] | None = None, heartbeat_s: float = HEARTBEAT_S,
                 share_slots: int = 0, transit_bytes: int = TRANSIT_BYTES) -> None:
        if not 0 < heartbeat_s <= MAX_HEARTBEAT_S:
            raise ValueError(f"heartbeat_s={heartbeat_s} must be in (0, {MAX_HEARTBEAT_S}]: the switch hands a rank "
                             "silent for 3 s to another connection")
        self.cfg, self.job, self.rank = cfg, job, rank
        self.heartbeat_s = heartbeat_s
        self.ctx, self.sock, self.monitor, self.address, self.transport = connect(cfg)
        self.wake_r, self.wake_w = os.pipe()
        weakref.finalize(self, _close_pipe, self.wake_r, self.wake_w)
        self.wake_pending = False  # a wake-up byte is on its way: commands queued meanwhile need no other
        os.set_blocking(self.wake_r, False)
        self.cmds: deque[Command] = deque()
        self.running = True
        self.thread = threading.Thread(target=self._run, name=f"nebula-channel-{job}-{rank}", daemon=True)
        self.shm = ArenaClient(cfg.shared_memory and self.transport in ("ipc", "unix"))
        self.stream = self.ctx is None  # the Unix stream endpoint (`channel.streamsock`), not ZeroMQ
        if self.stream:
            self.sock.share_ask = share_slots
        self.out = Outlet(self.sock, self.shm)
        self.streams = Streams(self.out, self.shm, window_bytes, job, cfg.cluster, rank, transit_bytes)
        self.switch = SwitchView(cfg, job, rank, stages, self.address, self.streams, self.shm, self.out)
        self.tx, self.rx, self.meters = self.streams.tx, self.streams.rx, self.streams.meters
        self.on_frame = Dispatcher("a worker's connection to its switch", {
            FrameType.DATA: self.streams.on_data, FrameType.ACK: self.streams.on_ack,
            FrameType.WELCOME: self.switch.on_welcome, FrameType.ERROR: self.switch.on_error,
            FrameType.SHM_RELEASE: lambda frame, *_: self.shm.on_release(frame.meta)})

    # ---- called from application threads ----
    @property
    def peers(self) -> dict[str, dict]:
        """Our switch's peer link states, as of its latest WELCOME."""
        return self.switch.peers

    @property
    def inc(self) -> int:
        """This start's incarnation (0 until our switch's first WELCOME)."""
        return self.switch.inc

    @property
    def max_message_bytes(self) -> int:
        """Our switch's link.max_message_bytes."""
        return self.streams.max_message_bytes

    def start(self) -> None:
        """Start the thread."""
        self.thread.start()

    def wait_welcome(self, timeout_s: float) -> None:
        """Block until the switch welcomed us; ChannelError naming the likely cause if it does not."""
        sw = self.switch
        if not sw.welcome.wait(timeout_s):
            taken = sw.fatal is None and str(sw.refusal or "").startswith("rank_taken")
            if not (taken and sw.welcome.wait(max(RANK_TAKEN_WAIT_S - timeout_s, 0.0))):
                raise sw.fatal or sw.refusal or silent_switch(self.address, self.transport, timeout_s)
        if sw.fatal is not None:
            raise sw.fatal

    def register(self, ch: ChannelKeys) -> Inbox:
        """Open a channel's streams; returns the inbox its application side reads."""
        inbox = Inbox()
        self._command(OpenChannel(ch, inbox))
        return inbox

    def submit(self, msg: OutMessage) -> None:
        """Queue a message on its sending stream (`msg.tx_id`, a channel's `tx_key.id`)."""
        self._command(msg)

    def consumed(self, cid: int) -> None:
        """The application took a message off the inbox of receiving channel `cid` (its `taken` already counts it).
        The I/O thread is woken only when no acknowledgement is owed: one that is owed goes within ACK_DELAY_S,
        and counts it then."""
        self.streams.taken.append(cid)
        if self.streams.acks.since is None and not self.wake_pending:
            self.wake_pending = True
            self._wake()

    def watch(self) -> None:
        """Start recording the channels that receive messages (those already holding some included)."""
        self._command(Watch())

    def ready(self, timeout_s: float) -> list[ChannelKey]:
        """Receiving keys of the channels that got messages since the last call, oldest first; [] on timeout."""
        return self.streams.ready(timeout_s, lambda: self.running)

    def _command(self, cmd: Command) -> None:
        self.cmds.append(cmd)
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
        return self.switch.unreachable(cluster)

    def wait_drained(self, timeout_s: float) -> bool:
        """Wait until every message sent so far is acknowledged; False on timeout or a stopped thread."""
        deadline = time.monotonic() + timeout_s
        while self.thread.is_alive():
            if not self.cmds and self.streams.idle():
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
        for inbox in list(self.streams.inboxes.values()) + list(self.streams.tx_inboxes.values()):
            with inbox.cond:
                inbox.cond.notify_all()

    # ---- the I/O thread ----
    def _run(self) -> None:
        sw = self.switch
        try:
            self._loop()
        except Exception as exc:  # pragma: no cover - last resort: make the failure visible to callers
            log.exception("channel I/O thread failed")
            sw.fail(ChannelError(f"channel I/O thread failed: {exc!r}"))
        finally:
            if sw.fatal is None:
                self._do_cmds()  # (commands still queued: their acknowledgements are owed too)
                say_goodbye(self.sock, self.streams, self.out)
            close_connection(self.ctx, self.sock, self.monitor, await_answer=sw.fatal is None)
            # (the wake pipe stays open until this object is collected: `stop` and the application's threads
            # may still write to it, and a descriptor closed here could be reused by then for another file)

    def _until(self, next_hello: float, next_check: float) -> float:
        """When the loop must look again at the latest, with no socket event."""
        streams, shm = self.streams, self.shm
        # an idle endpoint (nothing unacknowledged) wakes only to say HELLO: a thousand idle clients of one
        # machine do not spin on timers that have nothing to check
        until = min(next_hello, next_check) if streams.unacked else next_hello
        if streams.acks.since is not None:
            until = min(until, streams.acks.deadline)
        if shm.release_due is not None:
            until = min(until, shm.release_due)
        if shm.waiting and shm.full_since is not None:
            until = min(until, shm.full_since + SHM_WAIT_S)
        return until

    def _loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        poller.register(self.wake_r, zmq.POLLIN)
        if not self.stream:
            poller.register(self.monitor, zmq.POLLIN)
        sock_events = zmq.POLLIN
        next_hello = 0.0
        next_check = time.monotonic() + 1.0
        streams, shm = self.streams, self.shm
        while self.running:
            now = time.monotonic()
            if now >= next_hello:
                self.out.send_now(self.switch.hello_head, b"")
                next_hello = now + self.heartbeat_s
            if now >= next_check:
                streams.check_timeouts(now)
                next_check = now + 0.5
            # (a stream socket also writes, when it can, what the kernel did not take at once)
            want = zmq.POLLIN | (zmq.POLLOUT if self.out.pending or self.stream and self.sock.wants_write else 0)
            if want != sock_events:
                poller.modify(self.sock, want)
                sock_events = want
            events = dict(poller.poll(poll_ms(self._until(next_hello, next_check) - time.monotonic())))
            if self.wake_r in events:
                try:
                    while os.read(self.wake_r, 4096):
                        pass
                except BlockingIOError:
                    pass
            if self.stream:
                self.sock.flush()
                if self.monitor:
                    self._on_monitor()
            elif self.monitor in events:
                self._on_monitor()
            self.wake_pending = False  # before taking the commands: one queued after this wakes us again
            self._do_cmds()
            receive_all(self.sock, self.shm, self.on_frame)
            if streams.acks.since is None:
                streams.take_all_consumed()  # (woken for it: a consumption with no acknowledgement owed)
            if streams.acks.owed:
                streams.flush_acks()
                if streams.acks.since is None:
                    # a consumption counted between the look above and now found an acknowledgement owed, so it
                    # woke no one: look once more
                    streams.take_all_consumed()
            for head in shm.release_frames():
                self.out.control(head)
            self.out.drain()

    def _on_monitor(self) -> None:
        while True:
            if self.stream:
                if not self.monitor:
                    return
                ev = self.monitor.popleft()
            else:
                try:
                    ev = recv_monitor_message(self.monitor, zmq.NOBLOCK)
                except zmq.Again:
                    return
            err = handshake_failure(ev, self.cfg, self.address, self.transport)
            if err is not None:
                self.switch.fail(err)

    def _do_cmds(self) -> None:
        streams = self.streams
        while self.cmds:
            cmd = self.cmds.popleft()
            if isinstance(cmd, OutMessage):
                streams.submit(cmd.tx_id, cmd)
            elif isinstance(cmd, OpenChannel):
                streams.open(cmd.channel, cmd.inbox)
            elif isinstance(cmd, Watch):
                streams.watch()
        streams.frame_submitted()  # (the burst's small messages share frames)


def _close_pipe(*fds: int) -> None:
    for fd in fds:
        os.close(fd)
