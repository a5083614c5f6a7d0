"""Federated messages over Nebula channels: typed headers on the control lane (nebula.federated.protocol), models in
pieces on the bulk lane.

A message is [JSON header] or [JSON header, payload]; a model is one header naming its tensors (name, dtype, shape)
and the number of pieces, then that many piece messages of at most `piece_bytes` each, so neither side ever joins a
whole model into one buffer. A small model may travel inside its header's message instead (`inline`).
Which channel leads to whom: nebula.federated.actor_channels.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import time
from typing import Any, Callable, Collection, Iterable, Mapping

import numpy as np

from nebula.federated.actor_channels import (CHANNEL, CLIENT_WINDOW, COMBINER_RANK, CONTROLLER_RANK, EPOCH_WINDOW,
                                             FIRST_CLIENT_RANK, ActorChannels, Peer)
from nebula.federated.messages import TO_CLIENT, TO_COMBINER, TO_CONTROLLER
from nebula.federated.protocol import MessageFamily, Malformed, Message, ModelLayout, ProtocolError, decode, to_json

__all__ = ["Peer", "Messenger", "CONTROLLER_RANK", "COMBINER_RANK", "FIRST_CLIENT_RANK", "CHANNEL", "EPOCH_WINDOW",
           "CLIENT_WINDOW", "manifest", "ModelAssembler", "PUSH_BYTES", "model_nbytes", "piece_plan", "tensor_specs",
           "fits_inline", "MODEL_SLOTS"]

log = logging.getLogger(__name__)
PIECE_BYTES = 4 * 1024 * 1024
PUSH_BYTES = 1024 * 1024  # updates up to this size travel with their header, without waiting to be pulled
INLINE_PIECES = 64  # a small model in at most this many pieces travels inside its header's message
# slots a combiner asks its switch for: one piece in 1 MiB chunks (the default), sent to every peer
# before the next, goes to the switch once (`Messenger.send_model_to`, `nebula.wire.share`)
MODEL_SLOTS = 8


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


def _layout(msg: Message | ModelLayout | None) -> ModelLayout | None:
    return msg if isinstance(msg, ModelLayout) or msg is None else msg.model


class ModelAssembler:
    """Checks the pieces that follow a model header against the layout the header implies."""

    def __init__(self, header: Message | ModelLayout | None, who: str) -> None:
        self.who = who
        self.specs: dict[str, tuple[np.dtype, tuple[int, ...]]] = {}
        layout = _layout(header)
        try:
            if layout is None:
                raise ValueError("no model layout")
            for name, dtype, shape in layout.tensors:
                self.specs[str(name)] = (np.dtype(dtype), tuple(int(s) for s in shape))
            piece_bytes = int(layout.piece_bytes)
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


class Messenger(ActorChannels):
    """This actor's typed messages and models on its channels; `inbox` is the family of messages it receives
    (by default its role's: the controller's, a combiner's or a client's)."""

    def __init__(self, ep: Any, piece_bytes: int = PIECE_BYTES, controller: Peer | None = None, epoch: int = 0,
                 incarnation: int = 0, inbox: MessageFamily | None = None) -> None:
        super().__init__(ep, controller, epoch, incarnation)
        self.piece_bytes = piece_bytes
        self.sent_bytes: dict[str, int] = {}  # by destination cluster: what left this actor
        if inbox is None:
            inbox = TO_CONTROLLER if controller is not None and self.me == controller else \
                TO_COMBINER if self.me.rank == COMBINER_RANK else TO_CLIENT
        self.inbox = inbox

    def _count(self, peer: Peer, n: int) -> None:
        self.sent_bytes[peer.cluster] = self.sent_bytes.get(peer.cluster, 0) + n

    def send(self, peer: Peer, msg: Message | Mapping[str, Any], payload: bytes | memoryview | None = None,
             lane: str = "control", epoch: int | None = None) -> Any:
        """Send one message (on the channel of `epoch`, as `channel`); the channel's future. A raw mapping is sent
        as it is (tools and tests that speak for a misbehaving peer)."""
        head = to_json(msg)
        parts = [head] if payload is None else [head, payload]
        self._count(peer, len(head) + (0 if payload is None else len(payload)))
        return self.channel(peer, epoch).send(parts, lane=lane)

    def send_parts(self, peer: Peer, parts: list, lane: str = "bulk") -> Any:
        """Send one message of several parts (e.g. a compressed piece's frames); the channel's future."""
        self._count(peer, sum(len(memoryview(p).cast("B")) for p in parts))
        return self.channel(peer).send(parts, lane=lane)

    def model_header(self, msg: Message, weights: Mapping[str, np.ndarray], *, inline: bool = False,
                     frames: list[int] | None = None) -> Message:
        """`msg` with the layout of `weights` (their manifest and the piece size, which fix the pieces' layout)."""
        layout = ModelLayout(tensors=manifest(weights), piece_bytes=self.piece_bytes, inline=inline,
                             frames=None if frames is None else tuple(frames))
        return dataclasses.replace(msg, model=layout)

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

    def send_model(self, peer: Peer, msg: Message, weights: Mapping[str, np.ndarray], lane: str = "bulk",
                   inline: bool = False) -> Any:
        """Send `msg` (with the model's layout) and the model's pieces; the last piece's future.

        With `inline`, a small model (up to PUSH_BYTES in at most INLINE_PIECES pieces) goes as one message, its
        pieces as the parts after the header: one message and one acknowledgement through the switch instead of
        two or more, which is most of what a lightweight client costs its switch and combiner per round."""
        parts = self.inline_message(msg, weights) if inline else None
        if parts is not None:
            return self.send_parts(peer, parts, lane=lane)
        self.send(peer, self.model_header(msg, weights), lane="control")
        return self.send_pieces(peer, weights, lane)

    def send_model_to(self, msgs: Mapping[Peer, Message], weights: Mapping[str, np.ndarray], lane: str = "bulk"
                      ) -> None:
        """Send one model to many peers, each with its own message: a small model inside each message; a larger
        one after every message, piece by piece to all peers, each piece's bytes shared (`Channel.send`'s `share`):
        an endpoint with slots sends each piece to its switch once, whatever the number of peers."""
        first = next(iter(msgs.values()), None)
        if first is None:
            return
        inline = fits_inline(manifest(weights), self.piece_bytes)
        layout = self.model_header(first, weights, inline=inline).model  # (one layout and one set of views for all)
        if inline:
            views = list(self._views(weights))
            for p, msg in msgs.items():
                self.send_parts(p, [to_json(dataclasses.replace(msg, model=layout)), *views], lane=lane)
            return
        for p, msg in msgs.items():
            self.send(p, dataclasses.replace(msg, model=layout), lane="control")
        model = object()  # (the key of this model's bytes: a new object per call, so never another model's)
        for i, view in enumerate(self._views(weights)):
            for p in msgs:
                self._count(p, len(view))
                self.channel(p).send(view, lane=lane, share=(model, i))

    def inline_message(self, msg: Message, weights: Mapping[str, np.ndarray]) -> list | None:
        """The parts of `msg` with the model inline (None when it does not fit: send it with `send_model`); built
        once, they can go to many peers with `send_parts`."""
        if not fits_inline(manifest(weights), self.piece_bytes):
            return None
        return [to_json(self.model_header(msg, weights, inline=True)), *self._views(weights)]

    def decode(self, parts: list[memoryview], peer: Peer) -> tuple[Message, list[memoryview] | None]:
        """(the message of this actor's inbox, the parts after its header); ValueError for a header that is not a
        JSON object, a Malformed message for one that does not decode."""
        try:
            head = json.loads(bytes(parts[0]))
        except ValueError as exc:
            raise ValueError(f"{peer}: message header is not JSON ({exc})") from None
        rest = parts[1:] if len(parts) > 1 else None
        try:
            return decode(head, self.inbox), rest
        except ProtocolError as exc:
            return Malformed(claimed=exc.type, reason=f"{peer}: {exc}", head=exc.head), rest

    def recv(self, peer: Peer, timeout_s: float | None) -> tuple[Message, memoryview | None]:
        """Next message from `peer` (the message, its first payload part); TimeoutError when none comes in time."""
        msg, rest = self.decode(self.channel(peer).recv_parts(timeout_s), peer)
        return msg, (rest[0] if rest else None)

    def poll(self, peers: Collection[Peer], timeout_s: float, primary: Peer | None = None,
             wake: Collection[Peer] = ()) -> tuple[Peer, Message, list[memoryview] | None] | None:
        """The next message from any of `peers` (fair turns), or None after `timeout_s` or once one of `wake` has
        a message (`poll_parts`): a message of this actor's inbox, or Malformed. What is not a header at all (a
        piece of a model whose header was dropped) is skipped."""
        deadline = time.monotonic() + timeout_s
        while True:
            got = self.poll_parts(peers, max(0.0, deadline - time.monotonic()), primary, wake)
            if got is None:
                return None
            peer, parts = got
            try:
                msg, rest = self.decode(parts, peer)
            except ValueError as exc:
                log.warning("skipping a message from %s: %s", peer, exc)
                if time.monotonic() >= deadline:
                    return None
                continue
            return peer, msg, rest

    def skip_pieces(self, peer: Peer, msg: Message, timeout_s: float) -> None:
        """Read and drop the piece messages (raw or compressed) that follow `msg`'s model (none when inline)."""
        if msg.model is not None and not msg.model.inline:
            for _ in self.pieces(peer, msg, timeout_s):
                pass

    def pieces(self, peer: Peer, msg: Message | ModelLayout, timeout_s: float,
               inline: list[memoryview] | None = None) -> Iterable[list[memoryview]]:
        """The messages (each a list of parts) of the pieces of `msg`'s model: the parts that came with an inline
        header, or the next messages on `peer`'s channel. ValueError for an inline header whose parts are missing,
        TimeoutError when the pieces stop coming."""
        layout = _layout(msg)
        n = ModelAssembler(layout, f"{peer}").num_pieces
        if layout.inline:  # one part per piece, or `frames` parts each (compressed pieces)
            sizes = layout.frames if layout.frames is not None else (1,) * n
            if not (len(sizes) == n and all(k > 0 for k in sizes) and inline is not None
                    and sum(sizes) == len(inline)):
                raise ValueError(f"{peer}: inline model of {n} pieces came with {len(inline or [])} parts (frames "
                                 f"{str(layout.frames)[:40]})")
            at = 0
            for k in sizes:
                yield inline[at : at + k]
                at += k
            return
        deadline = time.monotonic() + timeout_s
        ch = self.channel(peer)
        for _ in range(n):
            yield ch.recv_parts(max(0.0, deadline - time.monotonic()))

    def recv_model(self, peer: Peer, msg: Message | ModelLayout, timeout_s: float,
                   on_piece: Callable[[str, np.ndarray, int], None] | None = None,
                   inline: list[memoryview] | None = None) -> dict[str, np.ndarray] | None:
        """Receive the pieces of `msg`'s model from `peer` (`inline`: the parts that came with it).

        With `on_piece`, each checked piece is handed over (streaming; returns None); otherwise the model is
        assembled into fresh arrays and returned. ValueError for a malformed piece, TimeoutError when the
        pieces stop coming.
        """
        asm = ModelAssembler(msg, f"{peer}")
        out = None if on_piece else {n: np.empty(s, d) for n, (d, s) in asm.specs.items()}
        for i, parts in enumerate(self.pieces(peer, msg, timeout_s, inline)):
            if len(parts) != 1:
                raise ValueError(f"{peer}: expected piece {i} of a model, got a message of {len(parts)} parts")
            name, off, vals = asm.piece(i, parts[0])
            if on_piece is not None:
                on_piece(name, vals, off)
            else:
                out[name].reshape(-1)[off : off + vals.size] = vals
        return out

