"""A model in pieces: the layout a header carries (`manifest`), the pieces both ends derive from it (`piece_plan`),
and the receiver's check of every piece against that layout (`ModelAssembler`).

A model is one header naming its tensors (name, dtype, shape) and the piece size, then that many piece messages of at
most `piece_bytes` each, so neither side ever joins a whole model into one buffer. A small model may travel inside its
header's message instead (`fits_inline`). Pure: no channels (those are `nebula.messaging.messenger`'s).
"""
from __future__ import annotations

from typing import Iterable, Mapping

import numpy as np

from nebula.messaging.protocol import Message, ModelLayout

__all__ = ["PIECE_BYTES", "PUSH_BYTES", "INLINE_PIECES", "manifest", "piece_plan", "fits_inline", "model_nbytes",
           "tensor_specs", "layout_of", "ModelAssembler"]

PIECE_BYTES = 4 * 1024 * 1024
PUSH_BYTES = 1024 * 1024  # updates up to this size travel with their header, without waiting to be pulled
INLINE_PIECES = 64  # a small model in at most this many pieces travels inside its header's message


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


def layout_of(msg: Message | ModelLayout | None) -> ModelLayout | None:
    """The layout of the model that follows `msg` (a layout passes as it is; None: no model)."""
    return msg if isinstance(msg, ModelLayout) or msg is None else msg.model


class ModelAssembler:
    """Checks the pieces that follow a model header against the layout the header implies."""

    def __init__(self, header: Message | ModelLayout | None, who: str) -> None:
        self.who = who
        self.specs: dict[str, tuple[np.dtype, tuple[int, ...]]] = {}
        layout = layout_of(header)
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
