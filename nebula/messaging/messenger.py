"""Typed messages and models in pieces over a Nebula endpoint's channels, for any message family.

A message is [JSON header] or [JSON header, payload] (`nebula.messaging.protocol`); a model is its header with the
model's layout, then its pieces on the bulk lane, or, small, inside the header's message (`nebula.messaging.pieces`).
A `Messenger` talks on one channel name per peer; a runtime whose channels follow restarts (the federated actors')
derives from it and overrides `channel`.
"""
from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

import numpy as np

from nebula.messaging.pieces import (PIECE_BYTES, ModelAssembler, fits_inline, layout_of, manifest, piece_plan,
                                     tensor_specs)
from nebula.messaging.protocol import (Malformed, Message, MessageFamily, ModelLayout, ProtocolError, decode_parts,
                                       encode_parts, to_json, unpack)

if TYPE_CHECKING:
    from nebula.channel import Channel, Endpoint

__all__ = ["Peer", "Messenger"]


@dataclass(frozen=True, slots=True, order=True)
class Peer:
    """One end of a channel: a rank of a cluster (an actor of a federation, a data-parallel leader)."""

    cluster: str
    rank: int

    def __str__(self) -> str:
        return f"{self.cluster}/{self.rank}"

    @classmethod
    def parse(cls, s: str) -> Peer:
        """`A/3` -> Peer("A", 3)."""
        c, _, r = s.rpartition("/")
        return cls(c, int(r))


class Messenger:
    """Typed messages of family `inbox` (what this end receives) and models in pieces, to and from peers of
    endpoint `ep` on the channels named `channel`; `sent_bytes` counts what left, by destination cluster."""

    def __init__(self, ep: Endpoint, inbox: MessageFamily, *, piece_bytes: int = PIECE_BYTES, channel: str = "msg"
                 ) -> None:
        self.ep, self.inbox, self.piece_bytes, self.channel_name = ep, inbox, piece_bytes, channel
        self.sent_bytes: dict[str, int] = {}

    def channel(self, peer: Peer, epoch: int | None = None) -> Channel:
        """The channel to `peer` (`epoch`: for runtimes whose channels follow restarts; unused here)."""
        return self.ep.channel(peer.cluster, peer.rank, self.channel_name)

    def _count(self, peer: Peer, n: int) -> None:
        self.sent_bytes[peer.cluster] = self.sent_bytes.get(peer.cluster, 0) + n

    def send(self, peer: Peer, msg: Message | Mapping[str, Any], payload: bytes | memoryview | None = None,
             lane: str = "control", epoch: int | None = None) -> Any:
        """Send one message (on the channel of `epoch`, as `channel`); the channel's future. A raw mapping is sent
        as it is (tools and tests that speak for a misbehaving peer)."""
        parts: list = encode_parts(msg) if isinstance(msg, Message) else [to_json(msg)]  # (header, raw part)
        if payload is not None:
            parts.append(payload)
        self._count(peer, sum(len(memoryview(p).cast("B")) for p in parts))
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
        """(the message of this actor's inbox, the parts after its header and raw part); ValueError for a header
        that is not a JSON object, a Malformed message for one that does not decode."""
        try:
            head = json.loads(bytes(parts[0]))
        except ValueError as exc:
            raise ValueError(f"{peer}: message header is not JSON ({exc})") from None
        rest = parts[1:] if len(parts) > 1 else None
        try:
            return decode_parts(head, self.inbox, rest)
        except ProtocolError as exc:
            return Malformed(claimed=exc.type, reason=f"{peer}: {exc}", head=exc.head), rest

    def recv(self, peer: Peer, timeout_s: float | None) -> tuple[Message, memoryview | None]:
        """Next message from `peer` (the message, its first payload part); TimeoutError when none comes in time."""
        msg, rest = self.decode(self.channel(peer).recv_parts(timeout_s), peer)
        return msg, (rest[0] if rest else None)

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
        layout = layout_of(msg)
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

    def receive_arrays(self, peer: Peer, parts: list, timeout_s: float) -> tuple[dict, dict[str, np.ndarray]]:
        """(header, arrays) of the message `parts` from `peer`: a model's tensors when its header carries a layout
        (its pieces inline in `parts`, or the next messages on `peer`'s channel, read here) or the raw arrays of
        `pack`. The header is left for the receiver to decode with its family; ProtocolError naming the problem,
        TimeoutError when a model's pieces stop coming."""
        try:
            head = json.loads(bytes(parts[0]))
        except ValueError as exc:
            raise ProtocolError(f"{peer}: message header is not JSON ({exc})") from None
        if not isinstance(head, dict) or ("tensors" not in head and "piece_bytes" not in head):
            return unpack(parts, str(peer))
        layout = ModelLayout(tensors=head.get("tensors"), piece_bytes=head.get("piece_bytes"),
                             inline=head.get("inline") is True)
        try:
            return head, self.recv_model(peer, layout, timeout_s, inline=list(parts[1:]) if layout.inline else None)
        except ValueError as exc:
            raise ProtocolError(str(exc), str(head.get("type"))[:32], head) from None
