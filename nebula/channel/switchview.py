"""What a worker knows of its own switch: the HELLO it says, the WELCOMEs it hears (its incarnation, the switch's
boot epoch and limits, the state of every peer link), and what follows from them (messages sent again after a
restart, the arena mapped, the first WELCOME awaited by `Endpoint.connect`)."""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Mapping

from nebula.channel.arena import ArenaClient
from nebula.channel.errors import ChannelError, SwitchRefused
from nebula.channel.outlet import Outlet
from nebula.channel.streams import Streams
from nebula.config.worker import WorkerConfig
from nebula.wire import FrameType, encode_frame

__all__ = ["SWITCH_SILENT_S", "SwitchView"]

log = logging.getLogger(__name__)

SWITCH_SILENT_S = 5.0  # no WELCOME for this long: our own switch is unreachable


class SwitchView:
    """Our switch as this endpoint sees it; only the I/O thread changes it (readers see whole values)."""

    def __init__(self, cfg: WorkerConfig, job: str, rank: int, stages: Mapping[str, str] | None, address: str,
                 streams: Streams, shm: ArenaClient, out: Outlet) -> None:
        self.cfg, self.job, self.rank, self.address = cfg, job, rank, address
        self.stages = dict(stages) if stages is not None else None
        self.streams, self.shm, self.out = streams, shm, out
        # this start's incarnation (nebula.channel.delivery): our switch gives it in its first WELCOME and checks
        # it on every frame we send; no channel carries a message before then
        self.inc = 0
        self.boot = 0
        self.peers: dict[str, dict] = {}
        self.last_welcome = 0.0
        self.welcome = threading.Event()
        self.fatal: BaseException | None = None
        self.refusal: BaseException | None = None
        self.resend_after_welcome = False
        self.hello_head = self._hello()

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

    def fail(self, err: BaseException) -> None:
        """The endpoint cannot go on: `Endpoint.connect` (or the next wait) raises `err`."""
        self.fatal = err
        self.welcome.set()

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

    def on_welcome(self, frame: Any, *_: Any) -> None:
        """A WELCOME: our incarnation (the first time), limits, link states; resend what a restart lost."""
        meta = frame.meta
        first = not self.welcome.is_set()
        self.last_welcome = time.monotonic()
        inc = meta.get("inc", 0)
        streams = self.streams
        if not self.inc:
            if not inc:
                self.fail(ChannelError(f"our switch at {self.address} gave this worker no incarnation in its "
                                       "WELCOME; it runs an older Nebula: upgrade it"))
                return
            self.inc = streams.inc = inc
            self.hello_head = self._hello()
        elif inc and inc != self.inc:
            log.warning("our switch names incarnation %d for us, but we are %d; ignored", inc, self.inc)
        if self.shm.wanted and "shm" in meta and self.shm.take(meta["shm"]):
            self.hello_head = self._hello()
            self.out.send_now(self.hello_head, b"")  # tells the switch we mapped it, so it may send downwards through it
        streams.chunk_bytes = meta["chunk_bytes"]
        streams.max_message_bytes = meta["max_message_bytes"]
        restarted = self.boot not in (0, meta["boot"])
        self.boot = meta["boot"]
        old_peers, self.peers = self.peers, meta["peers"]
        for tx in streams.tx.values():
            c = tx.key.dst_cluster
            before = old_peers.get(c, {}).get("epoch", 0)
            after = self.peers.get(c, {}).get("epoch", 0)
            if restarted or self.resend_after_welcome:
                streams.resend(tx, "our switch restarted")
            elif before not in (0, after):
                streams.resend(tx, f"the switch of {c} restarted")
        self.resend_after_welcome = False
        if restarted:
            now = time.monotonic()
            for cid in streams.rx:
                streams.acks.owe(cid, now)
        if first:
            self.welcome.set()

    def on_error(self, frame: Any, *_: Any) -> None:
        """A refusal: of one of our channels' messages, or of this connection (no HELLO yet, rank taken, ...)."""
        code, message = frame.meta["code"], frame.meta["message"]
        if code == "no_hello":
            # our switch restarted and does not know us yet: introduce ourselves and resend after its welcome
            self.out.send_now(self.hello_head, b"")
            self.resend_after_welcome = True
            return
        if frame.meta.get("channel") is not None:
            self.streams.on_error(frame)
            return
        log.warning("switch refused a frame: %s: %s", code, message)
        err = ChannelError(f"{code}: {message}")
        if code == "rank_taken":
            # retried by the heartbeat: the other connection may be a dead predecessor of this process
            self.refusal = err
        elif not self.welcome.is_set():
            self.fail(SwitchRefused(str(err)))
