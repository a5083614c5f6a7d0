"""The public API of worker-side channels: an Endpoint (one authenticated connection to the cluster's switch,
one I/O thread) and its Channels, ordered exactly-once message streams between ranks of a job.

Every message on a channel gets a sequence number. The receiving worker delivers each exactly once and in
order, and acknowledges what it received and what the application consumed; the sender keeps every
unacknowledged message and sends it again when its switch or the peer's switch restarted (seen through the
switch's epoch numbers) or when no acknowledgement came for a long time (`nebula.channel.delivery`). Messages name
the incarnations (process starts) of both ends, so a restarted rank takes nothing meant for or sent by a
predecessor that a switch kept for it. Over IPC,
payloads go through a shared-memory arena the switch offers (`nebula.channel.arena`).
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Hashable, Mapping, Sequence

from nebula.channel.delivery import OutMessage
from nebula.channel.sender import TRANSIT_BYTES
from nebula.channel.errors import ChannelError, PeerUnavailable
from nebula.channel.io import HEARTBEAT_S, IOThread
from nebula.channel.sendfuture import SendFuture
from nebula.config.worker import WorkerConfig, load_worker_config
from nebula.wire import ChannelKey, encode_meta, lane_of
from nebula.wire.share import MAX_SLOTS

__all__ = ["Endpoint", "Channel", "ChannelError", "PeerUnavailable", "DEFAULT_WINDOW_BYTES"]

DEFAULT_WINDOW_BYTES = 256 * 1024**2


class Endpoint:
    """One worker's connection to its cluster's switch server, shared by all its channels."""

    def __init__(self, cfg: WorkerConfig, job: str, rank: int, window_bytes: int,
                 stages: Mapping[str, str] | None = None, heartbeat_s: float = HEARTBEAT_S,
                 share_slots: int = 0, transit_bytes: int = TRANSIT_BYTES) -> None:
        self.cfg = cfg
        self.job = job
        self.rank = rank
        self.window_bytes = window_bytes
        self._closed = False
        self._io = IOThread(cfg, job, rank, window_bytes, stages, heartbeat_s, share_slots, transit_bytes)
        self._channels: dict[tuple[str, int, str], Channel] = {}
        self._lock = threading.Lock()

    @classmethod
    def connect(cls, worker_file: str | Path | WorkerConfig, *, job: str, rank: int, timeout_s: float = 30.0,
                window_bytes: int = DEFAULT_WINDOW_BYTES, stages: Mapping[str, str] | None = None,
                heartbeat_s: float = HEARTBEAT_S, share_slots: int = 0,
                transit_bytes: int = TRANSIT_BYTES) -> Endpoint:
        """Connect to the switch named in `worker_file` as rank `rank` of `job`; wait until it welcomes us.

        `stages` is the job file's stage -> cluster map, for jobs that name stages: the switch checks it against
        the account's `stage:` grants (ChannelError naming the missing grant and the command that adds it).
        `heartbeat_s`: how often we say HELLO (up to 2.5 s; workers that are many and mostly idle, as federated
        clients, say it less often than the default 1 s to spare their switch). `share_slots`: slots to ask the
        switch for, where payloads sent with `Channel.send`'s `share` go once (`nebula.wire.share`; over a stream
        connection only, and only as many as the switch grants: a combiner sending one model to many clients).

        `window_bytes` bounds what a channel's receiver has not consumed yet; `transit_bytes` what it has not
        received yet (on its way through the switches: raise it where one channel must fill a link whose round
        trip times its rate is more, e.g. 125 MB for 10 Gbit/s at 100 ms)."""
        if not isinstance(share_slots, int) or isinstance(share_slots, bool) or not 0 <= share_slots <= MAX_SLOTS:
            raise ValueError(f"share_slots={share_slots!r} must be a whole number from 0 (none) to {MAX_SLOTS}")
        for name, value in (("window_bytes", window_bytes), ("transit_bytes", transit_bytes)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}={value!r} must be a whole number of bytes, at least 1")
        cfg = worker_file if isinstance(worker_file, WorkerConfig) else load_worker_config(worker_file)
        if not isinstance(rank, int) or rank < 0:
            raise ValueError(f"rank {rank!r} must be a non-negative integer")
        if not job or not isinstance(job, str):
            raise ValueError(f"job {job!r} must be a non-empty string")
        ep = cls(cfg, job, rank, window_bytes, stages, heartbeat_s, share_slots, transit_bytes)
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

    def throughput(self, peer_cluster: str) -> float | None:
        """Bytes/s the link to `peer_cluster` delivered while busy, net of the round trip, as measured from the
        acknowledgements of this worker's messages (None until enough has been sent)."""
        meter = self._io.meters.get(peer_cluster)
        return None if meter is None else meter.bytes_per_s

    def peer_clusters(self) -> list[str]:
        """Clusters our switch has links to (as of its latest WELCOME)."""
        return sorted(self._io.peers)

    def link_state(self, peer_cluster: str) -> tuple[bool, str]:
        """(whether our switch's link to `peer_cluster` is up, that in words with our switch's address)."""
        why, at = self._io.unreachable(peer_cluster), self._io.address
        if why is None:
            return True, f"the link of our switch at {at} to cluster {peer_cluster!r} is up"
        return False, why if why.startswith("our switch") else f"our switch at {at}: {why}"

    def watch(self) -> None:
        """Record from now on which channels receive messages, for `ready`: a reader of many channels (a
        federated combiner serving a thousand clients) then looks only at those instead of at every channel."""
        self._io.watch()

    def ready(self, timeout_s: float) -> list[ChannelKey]:
        """After `watch`: the receiving keys (src = the peer) of the channels that got messages since the last
        call, oldest first, each once however many came; waits up to `timeout_s` for one, else []. A channel
        listed may since have been read empty (`Channel.pending`)."""
        return self._io.ready(timeout_s)

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
        self.tx_id, self.rx_id = self.tx_key.id, self.rx_key.id  # (hashes: computed once, not per message)
        self._inbox = ep._io.register(self)
        self._coders: dict[str, Any] = {}  # by direction: stateful codecs keep their state per channel and direction

    def send(self, data: bytes | bytearray | memoryview | Sequence[Any], lane: str = "activation",
             share: Hashable | None = None) -> Future:
        """Queue `data` (bytes-like, or a sequence of bytes-like parts); the future completes once the switch has it.

        `share` names these bytes (a key unique to them: messages sent with one key carry the same bytes): an
        endpoint opened with `share_slots` sends them to its switch once, whatever number of peers they go to."""
        ln = lane_of(lane)
        if type(data) is bytes:  # (kept as it is: a view of it would be two objects for the cyclic collector)
            view, parts = data, None
        elif isinstance(data, (bytes, bytearray, memoryview)):
            view, parts = memoryview(data).cast("B"), None
        else:
            items = [memoryview(p).cast("B") for p in data]
            parts = [len(p) for p in items]
            view = memoryview(b"".join(items)) if len(items) != 1 else items[0]
            if len(parts) > 500:  # keep the part list inside one frame's meta
                parts = None
        fut: Future = SendFuture()
        if self.ep._closed:
            fut.set_exception(ChannelError("endpoint is closed"))
            return fut
        limit = self.ep._io.max_message_bytes
        if len(view) > limit:
            fut.set_exception(ChannelError(
                f"message of {len(view)} bytes exceeds the switch's link.max_message_bytes={limit}; split it"))
            return fut
        self.ep._io.submit(OutMessage(view, parts, ln, fut, tx_id=self.tx_id, share=share))
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

    def pending(self) -> int:
        """Messages (and refusals) ready to be read now without waiting."""
        inbox = self._inbox
        with inbox.cond:
            return len(inbox.ready) + len(inbox.errors)

    def recv(self, timeout_s: float | None = None) -> bytes:
        """Next message on this channel, in order; TimeoutError, PeerUnavailable or ChannelError (refusals)."""
        return self._next(timeout_s)[0]

    def _next(self, timeout_s: float | None) -> tuple[bytes, list[int] | None]:
        inbox = self._inbox
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with inbox.cond:
            while not inbox.ready and not inbox.errors:
                if self.ep._closed:
                    raise ChannelError("endpoint is closed")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    down = self.ep._io.unreachable(self.peer_cluster)
                    if down is not None:
                        raise PeerUnavailable(self.peer_cluster, down)
                    raise TimeoutError(
                        f"no message on channel {self.name!r} from {self.peer_cluster}/{self.peer_rank} within {timeout_s} s")
                inbox.cond.wait(left if left is None else min(left, 1.0))
            if inbox.errors:
                raise inbox.errors.popleft()
            item = inbox.ready.popleft()
            inbox.taken += 1
        self.ep._io.consumed(self.rx_id)
        if item.error is not None:  # a message refused on arrival, in its place in the stream
            raise item.error
        return item.data, item.parts

    def send_tensor(self, x: Any, codec: Any = "none", lane: str = "activation") -> Future:
        """Encode `x` (numpy array or paddle.Tensor) with `codec` and send it."""
        return self.send(self._coder("tx").encode(x, codec), lane=lane)

    def recv_tensor(self, codec: Any = "none", timeout_s: float | None = None, like: str = "numpy") -> Any:
        """Receive and decode a tensor sent with `send_tensor` (the frames name their codec; a Codec instance
        given here decodes, so a stateful decoder keeps its state per channel)."""
        return self._coder("rx").decode(self.recv_parts(timeout_s), codec, like=like)

    def _coder(self, direction: str) -> Any:
        coder = self._coders.get(direction)
        if coder is None:
            from nebula.compress import TensorCoder  # late: a channel that sends only bytes needs no numpy

            coder = self._coders[direction] = TensorCoder()
        return coder
