"""Outgoing peer links over mutual TLS: one per peer cluster carries our frames (its accepted side: `session`).

The dialing side numbers every frame (link sequence), keeps it in a bounded retransmit buffer until the
accepting side acknowledges it, sends only within the credit the accepting side grants, serves lanes by
priority, and after a reconnect resends exactly what the other side did not receive.
"""
from __future__ import annotations

__all__ = ["HANDSHAKE_TIMEOUT_S", "IDLE_TIMEOUT_S", "OutboundLink", "Unacked", "kit_revision"]

import asyncio
import logging
import random
import ssl
import time
from collections import deque
from pathlib import Path
from typing import Any

from security._yaml import YamlError, parse_yaml

from nebula.config import PeerConfig, split_host_port
from nebula.wire import ChannelKey, Dispatcher, FrameType, Lane, WireError, encode_frame
from switch_server.budget import Party
from switch_server.fairlanes import FairLanes
from switch_server.framestream import FrameStream, write_frame
from switch_server.host import LinkHost
from switch_server.linklog import REFUSED_ALERTS, LinkLog
from switch_server.linkwriter import Unacked, write_loop, write_through
from switch_server.shaper import TokenBucket, min_rate
from switch_server.tlstransport import open_connection

log = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT_S = 10.0
IDLE_TIMEOUT_S = 15.0  # a link with no frame (not even a PONG or ACK) for this long is considered dead
PING_EVERY_S = 1.0
CHECKPOINT_MIN_S = 1.0  # a peer's audit checkpoints are taken at most this often per connection
HOLD_S = 2.0  # an account whose frames the peer drops (its ranks there are not connected) waits this long
KIT_FILE_MAX_BYTES = 64 * 1024


def kit_revision(config_path: Path | None) -> int | None:
    """The revision of the kit a switch.yaml lies in (`kit.yaml` beside it), None if it cannot be told."""
    if config_path is None:
        return None
    try:
        with open(Path(config_path).parent / "kit.yaml", "rb") as f:
            doc = parse_yaml(f.read(KIT_FILE_MAX_BYTES), "kit file")
    except (OSError, YamlError):
        return None
    rev = doc.get("revision") if isinstance(doc, dict) else None
    return rev if isinstance(rev, int) and not isinstance(rev, bool) and rev > 0 else None


class OutboundLink:
    """Our frames towards one peer cluster: lanes, retransmit buffer, credit, shaper, reconnect with backoff."""

    def __init__(self, server: LinkHost, peer: PeerConfig) -> None:
        self.server = server
        self.cluster = peer.cluster
        self.address = peer.address
        self.lanes = FairLanes()
        self.rtx: deque[Unacked] = deque()
        self.rtx_bytes = 0
        self.next_seq = 1
        self.up = False
        self.down_since = time.time()
        self.peer_epoch = 0
        self.rtt_s: float | None = None
        self.wake = asyncio.Event()
        self.bucket = TokenBucket(None)
        self.set_limits()
        self.task: asyncio.Task | None = None
        self.stopping = False
        self.writer: FrameStream | None = None
        self.parked: FrameStream | None = None  # the connection whose write loop waits on an empty queue
        self.peer_serial: int | None = None
        self.peer_not_after = 0.0
        self.sent_bytes = 0  # this session, for credit
        self.credit = 0
        self.bytes_out = 0  # since start, for status
        self.last_error = ""
        self.log = LinkLog(self.cluster)  # what is said of its ups and downs: each change once, then summaries
        self.established = False
        self.last_checkpoint = -CHECKPOINT_MIN_S
        self.on_frame = Dispatcher(f"the outgoing link to {self.cluster}", {
            FrameType.LINK_ACK: self._on_link_ack,
            FrameType.PONG: self._on_pong,
            FrameType.CHECKPOINT: self._on_checkpoint,
            FrameType.ERROR: self._on_error,
        })

    def set_limits(self) -> None:
        """Apply link.shape and limits.peer_rate_mbit (also on hot reload)."""
        cfg = self.server.cfg
        self.bucket.set_rate(min_rate(cfg.link.shape.rate_mbit, cfg.limits.peer_rate_mbit))
        self.delay_s = cfg.link.shape.delay_ms / 1000.0

    def start(self) -> None:
        """Start dialing."""
        self.task = asyncio.create_task(self._run(), name=f"link-{self.cluster}")

    async def stop(self) -> None:
        """Stop the link (queued frames are dropped; senders retransmit end to end)."""
        self.stopping = True
        if self.task is not None:
            self.task.cancel()
            # (3.11's wait_for can swallow a cancellation; `stopping` ends the loop then, the timeout bounds it)
            await asyncio.wait({self.task}, timeout=2.0)
        self._close()

    def enqueue(self, lane: Lane, head: bytes, payload: Any, party: Party | None = None) -> None:
        """Queue a frame for this peer (charged to `party`, e.g. the local account that sent it)."""
        n = len(head) + len(payload)
        if self.parked is not None and write_through(self, lane, head, payload, party, n):
            return
        self.lanes.push(lane, (head, payload, party), n)
        self.server.budget.charge(n, party)
        self.wake.set()

    def queued_bytes(self) -> int:
        """Bytes waiting in lanes plus unacknowledged bytes."""
        return self.lanes.bytes + self.rtx_bytes

    def drop_session(self, reason: str) -> None:
        """Close the current connection (e.g. the peer's certificate was revoked); it is dialed again later."""
        self.last_error = reason
        self._close()

    def _close(self) -> None:
        if self.writer is not None:
            self.writer.transport.abort()
            self.writer = None
        if self.up:
            self.up = False
            self.down_since = time.time()
            self.server.metrics.link_up.labels(peer=self.cluster).set(0)
            self.server.link_changed()

    async def _run(self) -> None:
        cfg = self.server.cfg.link
        backoff = cfg.reconnect_initial_s
        while not self.stopping:
            self.established = False
            try:
                await self._session()
            except asyncio.CancelledError:
                raise
            except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, ConnectionError) as exc:
                self.failed(*self.server.trust.link_down(self, exc))
            except WireError as exc:
                self.failed(f"peer sent a malformed frame: {exc}", logging.WARNING)
            except Exception as exc:
                log.exception("link to %s failed", self.cluster)
                self.failed(f"{type(exc).__name__}: {exc}", logging.ERROR)
            finally:
                self._close()
            if self.established:  # a cut after a working session is retried quickly
                backoff = cfg.reconnect_initial_s
            await asyncio.sleep(backoff * (0.5 + random.random() / 2))
            backoff = min(backoff * 2, cfg.reconnect_max_s)

    def failed(self, reason: str, level: int = logging.INFO) -> None:
        """A session ended or an attempt failed: `reason` is the link's last error, said as `LinkLog` decides."""
        self.last_error = reason
        line = self.log.failed(reason, level)
        log.log(line.level, "%s", line.text)

    async def _session(self) -> bool:
        """One connection to the peer: dial, check, LINK_HELLO, then serve it until it ends; False (with the reason
        said through `failed`) if it never came up."""
        server = self.server
        host, port = split_host_port(self.address)
        writer = FrameStream(server.cfg.link.chunk_bytes)
        try:
            await open_connection(host, port, server.trust.client_ctx, writer, HANDSHAKE_TIMEOUT_S)
            reader = writer
        except ssl.SSLError as exc:
            reason = server.trust.tls_reason(exc)
            if any(needle in str(exc).upper() for needle, _ in REFUSED_ALERTS):
                raise  # (the peer's alert about our certificate: `PeerTrust.link_down` says it with the fix)
            server.trust.peer_rejected(self.cluster, self.address, reason, str(exc), outgoing=True)
            self.failed(f"TLS handshake failed: {reason}: this switch refuses the certificate of peer "
                        f"{self.cluster} ({self.address}): {exc}", logging.WARNING)
            return False
        self.writer = writer
        ssl_obj = writer.get_extra_info("ssl_object")
        ident = server.trust.check_switch(ssl_obj, self.cluster, self.address, outgoing=True,
                                          federation=server.cfg.federation, peers=server.links)
        if ident is None:
            self.failed(f"this switch refuses the certificate of peer {self.cluster} ({self.address}): it is not "
                        f"the certificate of cluster {self.cluster} of this federation (see the audit log)",
                        logging.WARNING)
            return False
        self.peer_serial = server.trust.serial_of(ssl_obj)
        self.peer_not_after = server.trust.not_after_of(ssl_obj)
        write_frame(writer, encode_frame(FrameType.LINK_HELLO, {"cluster": server.cfg.cluster, "epoch": server.epoch}))
        try:
            frame, _, _ = await reader.read_frame(HANDSHAKE_TIMEOUT_S)
        except asyncio.IncompleteReadError as exc:
            if writer.error is not None:
                raise  # (a TLS alert: `PeerTrust.link_down` reads it)
            # (a peer that refuses a cluster it does not know without a word: a switch of an older version)
            self.failed(f"peer {self.cluster} ({self.address}) closed the connection after this switch's LINK_HELLO "
                        f"without a reason ({type(exc).__name__}); its peers list may lack cluster "
                        f"{server.cfg.cluster} (the admin's update that adds it not applied there): its log says why",
                        logging.WARNING)
            return False
        if frame.type == FrameType.ERROR:
            self.failed(*server.trust.peer_error(self, frame.meta["code"], frame.meta["message"], server.cfg.cluster,
                                                 kit_revision(getattr(server, "config_path", None))))
            return False
        if frame.type != FrameType.LINK_WELCOME or frame.meta["cluster"] != self.cluster:
            raise WireError("bad_handshake", f"expected LINK_WELCOME from {self.cluster}, got {frame.type.name} {frame.meta}")
        resume = frame.meta["resume"]
        epoch_changed = self.peer_epoch not in (0, frame.meta["epoch"])
        self.peer_epoch = frame.meta["epoch"]
        self.credit = frame.meta["credit"]
        self.sent_bytes = 0
        # what the peer already holds needs no resend; it is dropped when the peer acknowledges it
        resend = deque(e for e in self.rtx if e.link_seq > resume)
        if resend:
            server.metrics.retransmits.labels(peer=self.cluster).inc(len(resend))
        self.up = True
        self.established = True
        self.last_error = ""  # (what ended an earlier session is history once the link is up again)
        server.metrics.link_up.labels(peer=self.cluster).set(1)
        log.info("link to %s up (peer epoch %d, resume after %d, resending %d frames)%s",
                 self.cluster, self.peer_epoch, resume, len(resend), self.log.up())
        server.link_changed(peer_restarted=epoch_changed)
        self.send_checkpoint()
        reader.dispatch(self._on_frame)
        reader_task = asyncio.create_task(reader.serve(IDLE_TIMEOUT_S))
        ping_task = asyncio.create_task(self._pinger(writer))
        try:
            await write_loop(self, writer, resend, reader_task)
        finally:
            reader_task.cancel()
            ping_task.cancel()
            await asyncio.gather(reader_task, ping_task, return_exceptions=True)
        return True

    async def _pinger(self, writer: FrameStream) -> None:
        while not writer.transport.is_closing():
            write_frame(writer, encode_frame(FrameType.PING, {"t": time.monotonic()}))
            await asyncio.sleep(PING_EVERY_S)

    def send_checkpoint(self) -> None:
        """Send our latest signed audit checkpoint on this link."""
        head = self.server.checkpoints.frame()
        if head is not None and self.writer is not None:
            write_frame(self.writer, head)

    def _on_frame(self, frame: Any, _head: bytes, _payload: Any) -> None:
        """A frame from the peer on our outgoing connection (called as it is parsed)."""
        if self.writer is not None:
            self.writer.max_payload = self.server.cfg.link.chunk_bytes  # (hot reload may change it)
        self.on_frame(frame)

    def _on_link_ack(self, frame: Any) -> None:
        acked = frame.header.link_seq
        while self.rtx and self.rtx[0].link_seq <= acked:
            self.rtx_bytes -= self.rtx.popleft().nbytes
        self.credit = frame.meta["credit"]
        self.wake.set()

    def _on_pong(self, frame: Any) -> None:
        self.rtt_s = time.monotonic() - float(frame.meta["t"])
        self.server.metrics.rtt.labels(peer=self.cluster).set(self.rtt_s)

    def _on_checkpoint(self, frame: Any) -> None:
        now = time.monotonic()
        if now - self.last_checkpoint < CHECKPOINT_MIN_S:  # (a flood of them would have us verify and store each)
            self.server.metrics.peer_refused.labels(peer=self.cluster, reason="checkpoint_flood").inc()
            return
        self.last_checkpoint = now
        self.server.checkpoints.receive(self.cluster, frame.meta["checkpoint"])

    def _on_error(self, frame: Any) -> None:
        code, channel = frame.meta["code"], frame.meta.get("channel")
        if code == "account_held" and channel is not None:
            # the peer drops this account's frames for ranks of it that are not connected: its frames wait here
            # a while (others' go on), instead of spending the link's credit on frames the peer cannot take
            account = ChannelKey.from_meta(channel).account
            self.lanes.hold(("account", account), HOLD_S)
            log.info("peer %s holds back account %s for %.0f s: %s", self.cluster, account, HOLD_S,
                     frame.meta["message"])
            return
        log.warning("peer %s reports: %s: %s", self.cluster, code, frame.meta["message"])
