"""Federated messages over Nebula channels: JSON headers on the control lane, models in pieces on the bulk lane.

Every actor is one rank of the federation's job behind its cluster's switch: the controller is rank 0 of its
cluster, each cluster's combiner rank 1, clients ranks 2 and up. A message is [JSON header] or [JSON header,
payload]; a model is one header naming its tensors (name, dtype, shape) and the number of pieces, then that many
piece messages of at most `piece_bytes` each, so neither side ever joins a whole model into one buffer.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Collection, Iterable, Mapping

import numpy as np

from nebula.channel import Channel, ChannelError, Endpoint
from nebula.wire import ChannelKey

__all__ = ["Peer", "Messenger", "CONTROLLER_RANK", "COMBINER_RANK", "FIRST_CLIENT_RANK", "CHANNEL", "manifest",
           "ModelAssembler", "PUSH_BYTES", "model_nbytes", "piece_plan", "tensor_specs", "fits_inline"]

log = logging.getLogger(__name__)
CONTROLLER_RANK = 0
COMBINER_RANK = 1
FIRST_CLIENT_RANK = 2
CHANNEL = "fl"
# A channel's sequence numbers live as long as both its ends: a restarted controller cannot reuse its channels.
# Each start of the controller takes the next epoch (kept with its trail) and talks on channels named fl.c<epoch>;
# the others listen on the next EPOCH_WINDOW epochs and follow the newest they hear from.
EPOCH_WINDOW = 4
# Clients likewise: each start of a client process takes the next incarnation (kept in its state directory) and
# talks to the combiners on channels named fl.k<incarnation>; a combiner listens on a client's current and next
# incarnation, so a client that crashed and restarted rejoins with fresh channels.
CLIENT_WINDOW = 2
PIECE_BYTES = 4 * 1024 * 1024
PRIMARY_WAIT_S = 0.25  # a poll blocked on its primary peer looks at the others this often
FRESH_WAIT_S = 5.0  # a channel opened for a message that came before it: how long its registration may take
PUSH_BYTES = 1024 * 1024  # updates up to this size travel with their header, without waiting to be pulled
INLINE_PIECES = 64  # a small model in at most this many pieces travels inside its header's message


@dataclass(frozen=True, slots=True, order=True)
class Peer:
    """An actor of the federation: (cluster, rank)."""

    cluster: str
    rank: int

    def __str__(self) -> str:
        return f"{self.cluster}/{self.rank}"

    @classmethod
    def parse(cls, s: str) -> Peer:
        """`A/3` -> Peer("A", 3)."""
        c, _, r = s.rpartition("/")
        return cls(c, int(r))


def manifest(weights: Mapping[str, np.ndarray]) -> list[list]:
    """[name, dtype, shape] of every tensor, in order: what a model header carries."""
    return [[k, str(v.dtype), list(v.shape)] for k, v in weights.items()]


def piece_plan(specs: Iterable[tuple[str, np.dtype, tuple[int, ...]]], piece_bytes: int
               ) -> Iterable[tuple[str, int, int]]:
    """(tensor, first element, element count) of every piece, in order: both ends derive it from the header."""
    for name, dtype, shape in specs:
        item = np.dtype(dtype).itemsize
        step = max(1, piece_bytes // item)
        size = int(np.prod(shape, dtype=np.int64))
        for off in range(0, max(size, 1), step):
            yield name, off, min(step, size - off)


def fits_inline(tensors: list, piece_bytes: int) -> bool:
    """Whether a model of this manifest goes inline (one message with its header): small and in few pieces."""
    if not 0 < model_nbytes(tensors) <= PUSH_BYTES:
        return False
    specs = ((k, np.dtype(d), tuple(s)) for k, d, s in tensors)
    return sum(1 for _ in piece_plan(specs, piece_bytes)) <= INLINE_PIECES


def model_nbytes(tensors: list) -> int:
    """Bytes of a model from its manifest ([name, dtype, shape] entries); 0 for a malformed one."""
    try:
        return sum(np.dtype(d).itemsize * int(np.prod(s, dtype=np.int64)) for _, d, s in tensors)
    except (TypeError, ValueError):
        return 0


def tensor_specs(weights: Mapping[str, np.ndarray]) -> list[tuple[str, np.dtype, tuple[int, ...]]]:
    """(name, dtype, shape) of every tensor, in order: what `piece_plan` cuts into pieces."""
    return [(k, v.dtype, tuple(v.shape)) for k, v in weights.items()]


class ModelAssembler:
    """Checks the pieces that follow a model header against the layout the header implies."""

    def __init__(self, header: Mapping[str, Any], who: str) -> None:
        self.who = who
        self.specs: dict[str, tuple[np.dtype, tuple[int, ...]]] = {}
        try:
            for name, dtype, shape in header["tensors"]:
                self.specs[str(name)] = (np.dtype(dtype), tuple(int(s) for s in shape))
            piece_bytes = int(header["piece_bytes"])
            if piece_bytes < 4096:
                raise ValueError(f"piece_bytes={piece_bytes} < 4096")
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{who}: malformed model header ({exc}); send models with Messenger.send_model") from None
        self.plan = list(piece_plan(((k, d, s) for k, (d, s) in self.specs.items()), piece_bytes))
        self.num_pieces = len(self.plan)

    def piece(self, i: int, payload: memoryview) -> tuple[str, int, np.ndarray]:
        """(tensor name, element offset, values) of piece `i`; ValueError when its size is not the planned one."""
        name, off, count = self.plan[i]
        dtype = self.specs[name][0]
        if len(payload) != count * dtype.itemsize:
            raise ValueError(f"{self.who}: piece {i} of {name!r} has {len(payload)} bytes, expected "
                             f"{count * dtype.itemsize}")
        return name, off, np.frombuffer(payload, dtype)


class Messenger:
    """This actor's channels (one per peer, all called `fl`) and the send/receive helpers on them."""

    def __init__(self, ep: Endpoint, piece_bytes: int = PIECE_BYTES, controller: Peer | None = None,
                 epoch: int = 0, incarnation: int = 0) -> None:
        self.ep = ep
        self.me = Peer(ep.cluster, ep.rank)
        self.controller = controller
        self.epoch = epoch  # ours when we are the controller, else the newest controller epoch heard from
        self.incarnation = incarnation  # a client's own incarnation
        self.incarnations: dict[Peer, int] = {}  # a combiner's view: the newest incarnation heard from each client
        self.piece_bytes = piece_bytes
        self.sent_bytes: dict[str, int] = {}  # by destination cluster: what left this actor
        self._turn = 0
        self._ready: dict[ChannelKey, None] | None = None  # watch(): channels with messages, oldest first
        self._opened: set[ChannelKey] = set()

    def watch(self) -> None:
        """Have `poll` look only at the channels that received something (Endpoint.watch) instead of sweeping
        every listed peer: a poll then costs the same with 1000 peers as with 10, and a waiting actor sleeps until
        a message comes (no wake-ups to look)."""
        self._ready = {}
        self.ep.watch()

    def channel(self, peer: Peer, epoch: int | None = None) -> Channel:
        """The channel to `peer` (for the controller's channels: of `epoch`, default the current one)."""
        if self.controller is not None and self.controller in (peer, self.me):
            return self.ep.channel(peer.cluster, peer.rank, f"{CHANNEL}.c{self.epoch if epoch is None else epoch}")
        if self.me.rank == COMBINER_RANK and peer.rank >= FIRST_CLIENT_RANK:
            inc = self.incarnations.get(peer, 0) if epoch is None else epoch
            return self.ep.channel(peer.cluster, peer.rank, f"{CHANNEL}.k{inc}")
        if self.me.rank >= FIRST_CLIENT_RANK and peer.rank == COMBINER_RANK:
            return self.ep.channel(peer.cluster, peer.rank, f"{CHANNEL}.k{self.incarnation}")
        return self.ep.channel(peer.cluster, peer.rank, CHANNEL)

    def _listen(self, peer: Peer) -> list[tuple[Channel, int | None, str]]:
        if self.controller is not None and peer == self.controller and self.me != self.controller:
            return [(self.channel(peer, e), e, "c") for e in range(self.epoch, self.epoch + EPOCH_WINDOW)]
        if self.me.rank == COMBINER_RANK and peer.rank >= FIRST_CLIENT_RANK:
            inc = self.incarnations.get(peer, 0)
            return [(self.channel(peer, e), e, "k") for e in range(inc, inc + CLIENT_WINDOW)]
        return [(self.channel(peer), None, "")]

    def _count(self, peer: Peer, n: int) -> None:
        self.sent_bytes[peer.cluster] = self.sent_bytes.get(peer.cluster, 0) + n

    def send(self, peer: Peer, header: Mapping[str, Any], payload: bytes | memoryview | None = None,
             lane: str = "control", epoch: int | None = None) -> Any:
        """Send one message (on the channel of `epoch`, as `channel`); the channel's future."""
        head = json.dumps(header, separators=(",", ":")).encode()
        parts = [head] if payload is None else [head, payload]
        self._count(peer, len(head) + (0 if payload is None else len(payload)))
        return self.channel(peer, epoch).send(parts, lane=lane)

    def send_parts(self, peer: Peer, parts: list, lane: str = "bulk") -> Any:
        """Send one message of several parts (e.g. a compressed piece's frames); the channel's future."""
        self._count(peer, sum(len(memoryview(p).cast("B")) for p in parts))
        return self.channel(peer).send(parts, lane=lane)

    def model_header(self, header: Mapping[str, Any], weights: Mapping[str, np.ndarray]) -> dict:
        """`header` extended with the model's manifest and piece size (which fix the pieces' layout)."""
        return {**header, "tensors": manifest(weights), "piece_bytes": self.piece_bytes}

    def _views(self, weights: Mapping[str, np.ndarray]) -> Iterable[memoryview]:
        """Bare views of the model's pieces, in order (no copy: the channel keeps a view until acknowledged)."""
        flat = {k: memoryview(np.ascontiguousarray(v).reshape(-1)).cast("B") for k, v in weights.items()}
        for name, off, count in piece_plan(tensor_specs(weights), self.piece_bytes):
            item = weights[name].dtype.itemsize
            yield flat[name][off * item : (off + count) * item]

    def send_pieces(self, peer: Peer, weights: Mapping[str, np.ndarray], lane: str = "bulk") -> Any:
        """The model's pieces (after its header), each a message of its own; the last piece's future."""
        fut = None
        ch = self.channel(peer)
        for view in self._views(weights):
            self._count(peer, len(view))
            fut = ch.send(view, lane=lane)
        return fut

    def send_model(self, peer: Peer, header: Mapping[str, Any], weights: Mapping[str, np.ndarray],
                   lane: str = "bulk", inline: bool = False) -> Any:
        """Send `header` (extended with the manifest) and the model's pieces; the last piece's future.

        With `inline`, a small model (up to PUSH_BYTES in at most INLINE_PIECES pieces) goes as one message, its
        pieces as the parts after the header: one message and one acknowledgement through the switch instead of
        two or more, which is most of what a lightweight client costs its switch and combiner per round."""
        parts = self.inline_message(header, weights) if inline else None
        if parts is not None:
            return self.send_parts(peer, parts, lane=lane)
        self.send(peer, self.model_header(header, weights), lane="control")
        return self.send_pieces(peer, weights, lane)

    def inline_message(self, header: Mapping[str, Any], weights: Mapping[str, np.ndarray]) -> list | None:
        """The parts of `header` with the model inline (None when it does not fit: send it with `send_model`);
        built once, they can go to many peers with `send_parts`."""
        if not fits_inline(manifest(weights), self.piece_bytes):
            return None
        head = json.dumps(self.model_header({**header, "inline": True}, weights), separators=(",", ":")).encode()
        return [head, *self._views(weights)]

    def recv(self, peer: Peer, timeout_s: float | None) -> tuple[dict, memoryview | None]:
        """Next message from `peer` (header, its first payload part); TimeoutError when none comes in time."""
        head, rest = _decode(self.channel(peer).recv_parts(timeout_s), peer)
        return head, (rest[0] if rest else None)

    def poll(self, peers: Collection[Peer], timeout_s: float, primary: Peer | None = None
             ) -> tuple[Peer, dict, list[memoryview] | None] | None:
        """The next message from any of `peers` (fair turns), or None after `timeout_s`.

        Between sweeps it sleeps with back-off, or, given a `primary` peer (the one most messages come from),
        blocks on that peer's channel instead, which costs no CPU however many actors wait in one process.
        """
        if self._ready is not None:
            return self._poll_ready(peers, timeout_s)
        deadline = time.monotonic() + timeout_s
        nap = 0.0005
        while True:
            n = len(peers)
            for i in range(n):
                peer = peers[(self._turn + i) % n]
                parts = None
                for ch, epoch, kind in self._listen(peer):
                    try:
                        parts = ch.recv_parts(0)
                    except TimeoutError:
                        continue
                    except ChannelError:
                        continue  # the peer's cluster is unreachable: its actors time out like silent ones
                    if kind == "c" and epoch > self.epoch:
                        self.epoch = epoch  # a restarted controller: follow it
                    elif kind == "k" and epoch > self.incarnations.get(peer, 0):
                        self.incarnations[peer] = epoch  # a restarted client: talk on its new channels
                    break
                if parts is None:
                    continue
                self._turn = (self._turn + i + 1) % max(n, 1)
                try:
                    head, payload = _decode(parts, peer)
                except ValueError as exc:  # e.g. a model piece whose header we never read: skip it
                    log.warning("skipping a message from %s: %s", peer, exc)
                    continue
                return peer, head, payload
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            if primary is not None:
                try:
                    parts = self.channel(primary).recv_parts(min(left, PRIMARY_WAIT_S))
                except (TimeoutError, ChannelError):
                    continue
                try:
                    head, payload = _decode(parts, primary)
                except ValueError as exc:
                    log.warning("skipping a message from %s: %s", primary, exc)
                    continue
                return primary, head, payload
            time.sleep(min(nap, left))
            nap = min(nap * 2, 0.02)

    def _poll_ready(self, peers: Collection[Peer], timeout_s: float) -> tuple[Peer, dict, list[memoryview] | None] | None:
        """`poll` of a watching mailbox: the channels that received something, oldest first, are the only ones
        looked at; a channel is visited for one message at a time, so a busy peer cannot starve the others."""
        wanted = peers if isinstance(peers, (set, frozenset)) else set(peers)
        deadline = time.monotonic() + timeout_s
        while True:
            for key in list(self._ready):
                got = self._take(key, wanted)
                if got is not None:
                    return got
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            for key in self.ep.ready(left):
                self._ready[key] = None

    def _take(self, key: ChannelKey, wanted: Collection[Peer]) -> tuple[Peer, dict, list[memoryview] | None] | None:
        """One message of the channel whose receiving key is `key`, or None (its entry dropped unless the peer
        is merely not wanted by this poll)."""
        peer = Peer(key.src_cluster, key.src_rank)
        if peer not in wanted:
            return None
        name, n = key.name, None
        kind = name[len(CHANNEL) + 1] if name.startswith(CHANNEL + ".") else ""
        if kind:
            try:
                n = int(name[len(CHANNEL) + 2:])
            except ValueError:
                kind = "?"
        client = self.me.rank >= FIRST_CLIENT_RANK  # a client talks on its own incarnation only
        oldest = (self.incarnation if client else self.incarnations.get(peer, 0)) if kind == "k" else self.epoch
        stale = (name != CHANNEL and kind not in ("c", "k")) or (kind in ("c", "k") and n < oldest) \
            or (client and kind == "k" and n != self.incarnation)
        ch = None if stale else self.ep.channel(key.src_cluster, key.src_rank, name)
        # a channel opened just now gets the messages that came before it once the I/O thread has registered it
        fresh = ch is not None and key not in self._opened
        if ch is None or not (fresh or ch.pending()):
            del self._ready[key]  # an old epoch's or incarnation's channel, or one read empty since
            return None
        self._opened.add(key)
        try:
            parts = ch.recv_parts(FRESH_WAIT_S if fresh else 0)
        except (TimeoutError, ChannelError):
            del self._ready[key]
            return None
        del self._ready[key]
        if ch.pending():
            self._ready[key] = None  # more waiting: to the back of the queue
        if kind == "c" and n > self.epoch:
            self.epoch = n  # a restarted controller: follow it
        elif kind == "k" and not client and n > self.incarnations.get(peer, 0):
            self.incarnations[peer] = n  # a restarted client: talk on its new channels
        try:
            head, payload = _decode(parts, peer)
        except ValueError as exc:
            log.warning("skipping a message from %s: %s", peer, exc)
            return None
        return peer, head, payload

    def skip_pieces(self, peer: Peer, header: Mapping[str, Any], timeout_s: float) -> None:
        """Read and drop the piece messages (raw or compressed) that follow model `header` (none when inline)."""
        if not header.get("inline"):
            for _ in self.pieces(peer, header, timeout_s):
                pass

    def pieces(self, peer: Peer, header: Mapping[str, Any], timeout_s: float,
               inline: list[memoryview] | None = None) -> Iterable[list[memoryview]]:
        """The messages (each a list of parts) of the pieces that follow model `header`: the parts that came
        with an inline header, or the next messages on `peer`'s channel. ValueError for an inline header whose
        parts are missing, TimeoutError when the pieces stop coming."""
        n = ModelAssembler(header, f"{peer}").num_pieces
        if header.get("inline"):  # one part per piece, or `frames` parts each (compressed pieces)
            sizes = header.get("frames", [1] * n)
            if not (isinstance(sizes, list) and len(sizes) == n and all(type(k) is int and k > 0 for k in sizes)
                    and inline is not None and sum(sizes) == len(inline)):
                raise ValueError(f"{peer}: inline model of {n} pieces came with {len(inline or [])} parts (frames "
                                 f"{str(header.get('frames'))[:40]})")
            at = 0
            for k in sizes:
                yield inline[at : at + k]
                at += k
            return
        deadline = time.monotonic() + timeout_s
        ch = self.channel(peer)
        for _ in range(n):
            yield ch.recv_parts(max(0.0, deadline - time.monotonic()))

    def recv_model(self, peer: Peer, header: Mapping[str, Any], timeout_s: float,
                   on_piece: Callable[[str, np.ndarray, int], None] | None = None,
                   inline: list[memoryview] | None = None) -> dict[str, np.ndarray] | None:
        """Receive the pieces of model `header` from `peer` (`inline`: the parts that came with it).

        With `on_piece`, each checked piece is handed over (streaming; returns None); otherwise the model is
        assembled into fresh arrays and returned. ValueError for a malformed piece, TimeoutError when the
        pieces stop coming.
        """
        asm = ModelAssembler(header, f"{peer}")
        out = None if on_piece else {n: np.empty(s, d) for n, (d, s) in asm.specs.items()}
        for i, parts in enumerate(self.pieces(peer, header, timeout_s, inline)):
            if len(parts) != 1:
                raise ValueError(f"{peer}: expected piece {i} of a model, got a message of {len(parts)} parts")
            name, off, vals = asm.piece(i, parts[0])
            if on_piece is not None:
                on_piece(name, vals, off)
            else:
                out[name].reshape(-1)[off : off + vals.size] = vals
        return out


def _decode(parts: list[memoryview], peer: Peer) -> tuple[dict, list[memoryview] | None]:
    try:
        head = json.loads(bytes(parts[0]))
    except ValueError as exc:
        raise ValueError(f"{peer}: message header is not JSON ({exc})") from None
    if not isinstance(head, dict):
        raise ValueError(f"{peer}: message header is not a JSON object")
    return head, (parts[1:] if len(parts) > 1 else None)
