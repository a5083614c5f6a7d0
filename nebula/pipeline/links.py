"""Point-to-point message links between paired ranks of two clusters, and the background I/O around them.

`Link` is the small interface the runtime needs (send frames, receive one message). `ChannelLink` carries it over
`nebula.channel` (through the switch servers); `QueueLink` is an in-process pair for unit tests of the schedule.
`LinkSender` encodes and sends in a background thread (so compute overlaps the link); `LinkReceiver` receives and
decodes in a background thread and hands tensors out by key (step, micro-batch, index), so arrival order does not
matter.
"""
from __future__ import annotations

import abc
import logging
import queue
import struct
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from nebula.compress import TensorCoder, encoded_to_frames
from nebula.compress.delta import is_keyed

__all__ = ["Link", "ChannelLink", "QueueLink", "queue_pair", "LinkSender", "LinkReceiver", "PeerLost", "PeerNeverCame",
           "LinkStats"]

log = logging.getLogger(__name__)

_HEADER = struct.Struct("<qii")  # step, micro-batch, index: every boundary message starts with it
Key = tuple[int, int, int]


class PeerLost(RuntimeError):
    """The peer cluster stayed silent (or unreachable) longer than the job's peer_timeout_s."""

    def __init__(self, cluster: str, message: str) -> None:
        super().__init__(message)
        self.cluster = cluster


class PeerNeverCame(PeerLost):
    """Nothing ever came from the peer cluster within the start-up wait: it was never started, or cannot reach us."""


class Link(abc.ABC):
    """One direction of a boundary between this rank and one rank of a peer cluster."""

    peer_cluster: str
    peer_rank: int

    @abc.abstractmethod
    def send(self, frames: Sequence[bytes | memoryview], lane: str) -> Future:
        """Queue one message made of `frames`; the future completes when it has left this process."""

    @abc.abstractmethod
    def recv(self, timeout_s: float) -> bytes:
        """Next message; TimeoutError when none arrived within `timeout_s`."""

    def close(self) -> None:
        """Release resources (the endpoint owner closes the connection)."""

    def throughput_bytes_per_s(self) -> float | None:
        """The link's measured throughput to the peer cluster (None: not measured, e.g. an in-process link)."""
        return None

    def peer_state(self) -> tuple[bool, str] | None:
        """(whether our switch's link to the peer cluster is up, that in words with our switch's address); None
        where no switch is in between (an in-process link)."""
        return None


class ChannelLink(Link):
    """A link over a `nebula.channel` channel (ordered, exactly-once, through the switch servers)."""

    def __init__(self, endpoint: Any, peer_cluster: str, peer_rank: int, name: str) -> None:
        self.peer_cluster, self.peer_rank, self.name = peer_cluster, peer_rank, name
        self._ch = endpoint.channel(peer_cluster, peer_rank, name)

    def send(self, frames: Sequence[bytes | memoryview], lane: str) -> Future:
        """Hand the frames to the channel's background sender."""
        return self._ch.send(list(frames), lane=lane)

    def recv(self, timeout_s: float) -> bytes:
        """Receive one message; channel errors (PeerUnavailable, ChannelError) propagate."""
        return self._ch.recv(timeout_s=timeout_s)

    def throughput_bytes_per_s(self) -> float | None:
        """What the endpoint measured from the acknowledgements of its messages to the peer cluster."""
        return self._ch.ep.throughput(self.peer_cluster)

    def peer_state(self) -> tuple[bool, str] | None:
        """Our switch's address and its link to the peer cluster, as of the switch's latest WELCOME."""
        return self._ch.ep.link_state(self.peer_cluster)


class QueueLink(Link):
    """In-process link: what one end sends, the other receives (for unit tests of the pure schedule logic)."""

    def __init__(self, out_q: "queue.Queue[bytes]", in_q: "queue.Queue[bytes]", peer_cluster: str = "peer",
                 peer_rank: int = 0) -> None:
        self._out, self._in = out_q, in_q
        self.peer_cluster, self.peer_rank = peer_cluster, peer_rank

    def send(self, frames: Sequence[bytes | memoryview], lane: str) -> Future:
        """Concatenate the frames into one message, as a channel delivers them."""
        self._out.put(b"".join(bytes(f) for f in frames))
        fut: Future = Future()
        fut.set_result(None)
        return fut

    def recv(self, timeout_s: float) -> bytes:
        """Block up to `timeout_s` for the next message."""
        try:
            return self._in.get(timeout=timeout_s)
        except queue.Empty:
            raise TimeoutError(f"nothing received within {timeout_s} s") from None


def queue_pair(a: str = "A", b: str = "B") -> tuple[QueueLink, QueueLink]:
    """Two connected in-process links: the first is cluster `a`'s end, the second `b`'s."""
    ab: queue.Queue = queue.Queue()
    ba: queue.Queue = queue.Queue()
    return QueueLink(ab, ba, peer_cluster=b), QueueLink(ba, ab, peer_cluster=a)


@dataclass(slots=True)
class LinkStats:
    """Counters one boundary direction accumulates; the runtime reads and resets them every step."""

    bytes_sent: int = 0
    bytes_recv: int = 0
    messages_sent: int = 0
    messages_recv: int = 0  # taken by the step (not when they arrive: a sender may run ahead)
    codec_s: float = 0.0  # encode + decode time, spent in background threads
    raw_bytes_sent: int = 0  # what was sent before its codec: bytes_sent over this is the compression achieved
    messages_dup: int = 0  # arrived under a key whose message still waited (a message delivered twice)

    def take(self) -> "LinkStats":
        """Return a copy and reset the counters."""
        out = LinkStats(self.bytes_sent, self.bytes_recv, self.messages_sent, self.messages_recv, self.codec_s,
                        self.raw_bytes_sent, self.messages_dup)
        self.bytes_sent = self.bytes_recv = self.messages_sent = self.messages_recv = self.raw_bytes_sent = 0
        self.messages_dup = 0
        self.codec_s = 0.0
        return out


class LinkSender:
    """Encodes tensors with a per-direction codec and sends them, in one background thread (order kept).

    A paddle.Tensor on an accelerator is encoded with paddle ops on its device and only the compressed bytes reach
    the host; a CPU tensor goes through numpy (`nebula.compress.backend.codec_path`). After each
    send the link's measured throughput goes to the direction's bandwidth-adaptive codecs (auto).
    """

    def __init__(self, link: Link, lane: str, stats: LinkStats) -> None:
        from nebula.pipeline.bandwidth import BandwidthFeed

        self.link, self.lane, self.stats = link, lane, stats
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"send-{link.peer_cluster}")
        self._coder = TensorCoder()  # stateful codecs keep their state per direction, one instance per spec
        self._specs: set[str] = set()  # specs this direction has sent with
        self.bandwidth = BandwidthFeed(link.throughput_bytes_per_s)
        self._pending: list[Future] = []
        self._lock = threading.Lock()

    def send(self, key: Key, array: Any, codec: str, ids: np.ndarray | None = None) -> None:
        """Encode and send `array` (paddle.Tensor or numpy array) under `key` in the background; errors surface in
        `flush`. `ids`: the sample id of each row, for a keyed codec (activation deltas, `nebula.compress.delta`)."""
        fut = self._pool.submit(self._send, key, array, codec, ids)
        with self._lock:
            self._pending.append(fut)

    def _send(self, key: Key, array: Any, codec: str, ids: np.ndarray | None = None) -> None:
        if codec not in self._specs:
            self._specs.add(codec)
        self.bandwidth.feed(self._coder.codec(s) for s in self._specs)
        t0 = time.perf_counter()
        c = self._coder.codec(codec)
        if ids is not None and is_keyed(c):  # (in send order: the receiver's cache follows the same sequence)
            frames = encoded_to_frames(c.encode_keyed(array, ids))
        else:
            frames = self._coder.encode(array, codec)
        self.stats.codec_s += time.perf_counter() - t0
        header = _HEADER.pack(*key)
        nbytes = len(header) + sum(len(memoryview(f).cast("B")) for f in frames)
        self.link.send([header, *frames], self.lane).result()
        self.stats.bytes_sent += nbytes
        self.stats.raw_bytes_sent += len(header) + _raw_nbytes(array)
        self.stats.messages_sent += 1

    def cache_bytes(self) -> int:
        """Bytes the keyed codecs' caches of this sender hold (activation deltas)."""
        return sum(getattr(self._coder.codec(s), "cache_bytes", 0) for s in list(self._specs))

    def flush(self) -> None:
        """Wait until every queued message has been handed to the link; re-raise the first send error."""
        with self._lock:
            pending, self._pending = self._pending, []
        for fut in pending:
            fut.result()

    def close(self) -> None:
        """Stop the sender thread (after what is queued)."""
        self._pool.shutdown(wait=True, cancel_futures=False)


def _raw_nbytes(array: Any) -> int:
    """Bytes of a numpy array or paddle.Tensor as it is, before any codec."""
    if isinstance(array, np.ndarray):
        return int(array.nbytes)
    return int(np.prod(array.shape)) * int(array.element_size())


def _transient(exc: BaseException) -> bool:
    """Errors that may heal while we wait (the peer cluster's switch is down or unreachable)."""
    from nebula.channel import PeerUnavailable  # (here: the in-process links of unit tests need no ZeroMQ)

    return isinstance(exc, (ConnectionError, OSError, PeerUnavailable))


class LinkReceiver:
    """Receives and decodes messages of one link in a background thread; `get(key)` waits for a given key."""

    def __init__(self, link: Link, stats: LinkStats, *, peer_timeout_s: float, what: str, like: str = "numpy",
                 keyed: Callable[[int], str] | None = None) -> None:
        self.link, self.stats, self.peer_timeout_s, self.what = link, stats, peer_timeout_s, what
        self.keyed = keyed  # step -> the codec spec this end expects; a keyed one decodes with this end's cache
        self._keyed_specs: set[str] = set()
        self.like = like  # 'paddle': decoded with paddle ops onto this process's device
        self._items: dict[Key, np.ndarray] = {}
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._error: BaseException | None = None  # last transient error (peer switch unreachable)
        self._fatal: BaseException | None = None  # refused or malformed message: this boundary cannot go on
        self._last_heard = time.monotonic()
        self._heard = False  # anything at all came on this link
        self._coder = TensorCoder()
        self._thread = threading.Thread(target=self._run, name=f"recv-{link.peer_cluster}-{what}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.link.recv(timeout_s=0.5)
            except TimeoutError:
                continue
            except Exception as exc:  # noqa: BLE001 - reported by get()
                with self._cond:
                    if _transient(exc):  # the peer's switch may come back within the timeout
                        self._error = exc
                    else:
                        self._fatal = exc
                    self._cond.notify_all()
                if self._fatal is not None:
                    return
                self._stop.wait(0.5)
                continue
            try:
                view = memoryview(data)
                key = _HEADER.unpack_from(view)
                t0 = time.perf_counter()
                array = self._coder.decode([view[_HEADER.size:]], self._stateful(key[0]), like=self.like)
                self.stats.codec_s += time.perf_counter() - t0
            except Exception as exc:  # noqa: BLE001 - a malformed message is fatal for this boundary
                with self._cond:
                    self._fatal = exc
                    self._cond.notify_all()
                return
            with self._cond:
                self.stats.bytes_recv += len(view)
                self.stats.messages_dup += key in self._items
                self._items[key] = array
                self._error = None
                self._last_heard = time.monotonic()
                self._heard = True
                self._cond.notify_all()

    def _stateful(self, step: int) -> Any:
        """This end's instance of a keyed codec expected at `step` (its cache follows the sender's), else None."""
        if self.keyed is None:
            return None
        spec = self.keyed(step)
        c = self._coder.codec(spec)
        if not is_keyed(c):
            return None
        self._keyed_specs.add(spec)
        return c

    def cache_bytes(self) -> int:
        """Bytes the keyed codecs' caches of this receiver hold."""
        return sum(self._coder.codec(s).cache_bytes for s in list(self._keyed_specs))

    def get(self, key: Key, timeout_s: float | None = None) -> np.ndarray:
        """The array sent under `key`; waits up to `timeout_s` (default peer_timeout_s) of silence, then PeerLost."""
        limit = self.peer_timeout_s if timeout_s is None else timeout_s
        start = time.monotonic()
        next_warn = 10.0
        with self._cond:
            while key not in self._items:
                if self._fatal is not None:
                    raise RuntimeError(f"{self.what} from cluster {self.link.peer_cluster}: {self._fatal}") \
                        from self._fatal
                waited = time.monotonic() - start
                silent = time.monotonic() - max(self._last_heard, start)
                if silent >= limit and timeout_s is not None and not self._heard:
                    raise self._never_came(limit)
                if silent >= limit:
                    why = f" (last error: {self._error})" if self._error else ""
                    raise PeerLost(self.link.peer_cluster,
                                   f"peer cluster {self.link.peer_cluster} (rank {self.link.peer_rank}) sent nothing "
                                   f"for {silent:.0f} s while waiting for {self.what} step {key[0]} micro-batch "
                                   f"{key[1]}{why}; gave up after {limit:g} s (peer_timeout_s={self.peer_timeout_s:g}). Restart "
                                   "all clusters of the job: they resume from the last common checkpoint")
                if waited >= next_warn:
                    log.warning("waiting for peer cluster %s rank %d: %s step %d micro-batch %d (%.0f s, giving up "
                                "after %g s of silence)%s", self.link.peer_cluster, self.link.peer_rank, self.what,
                                key[0], key[1], waited, limit,
                                f"; {self._error}" if self._error else "")
                    next_warn += 10.0
                self._cond.wait(timeout=min(1.0, limit))
            self.stats.messages_recv += 1
            return self._items.pop(key)

    def _never_came(self, limit: float) -> PeerNeverCame:
        """The one line for a peer cluster that sent nothing at all within a start-up wait: which cluster, what
        our switch says of the link to it, and what to start."""
        c, r = self.link.peer_cluster, self.link.peer_rank
        state = self.link.peer_state()
        if state is None:
            where, fix = "", f"start cluster {c}'s part of the job"
        elif state[0]:
            where, fix = f"; {state[1]}", (f"its switch is up, so start cluster {c}'s part of the job there (nebula "
                                           f"launch with this job file and --cluster {c})")
        else:
            where, fix = f"; {state[1]}", (f"start cluster {c}'s switch (nebula-switch serve) and its part of the "
                                           f"job (nebula launch ... --cluster {c}), or check the WAN link between "
                                           "the switches")
        return PeerNeverCame(c, f"cluster {c} never came: its rank {r} sent no {self.what} within the start-up wait "
                                f"(startup_timeout_s): gave up after {limit:g} s{where}; {fix}, then restart every "
                                "cluster of the job")

    def close(self) -> None:
        """Stop the receiver thread."""
        self._stop.set()
        self._thread.join(timeout=2.0)
