"""One client update taken in at a combiner, streaming, and its counterpart on the client (compressed updates).

An update arrives as the pieces of a model (`transport`): raw values, or, with `update_codec` in the job file, each
piece's change from the global model encoded with the project's codecs (`nebula.compress`; `ef(...)` keeps its
error-feedback residual on the client across rounds). Each piece is decoded, checked (its size and dtype, finite
values, and the L2 norm of the whole update's change from the global model against the job's `max_update_norm`)
and then either held (small updates) or written to a spool file (large ones) until the whole update has
proved good; only then is it folded into the round's aggregate, piece by piece. So a refused update never touches
the aggregate, and a combiner taking in a large model's updates holds the aggregate plus a few pieces: the spool
lives in the page cache, not in the process. Under central differential privacy the checked update's change (as
decoded: what is aggregated) is scaled to `clip_norm` as it is folded (`clip_pieces`).
"""
from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np

from nebula.federated.messages import ClientUpdate
from nebula.federated.transport import ActorMessenger
from nebula.messaging import ModelAssembler, Peer, piece_plan, tensor_specs

__all__ = ["Refused", "ReceivedUpdate", "receive_update", "UpdateEncoder", "GlobalModel", "SPOOL_BYTES",
           "NONE_CODEC", "clip_pieces"]

SPOOL_BYTES = 64 * 1024**2  # updates larger than this wait in a spool file, not in memory, until checked
NONE_CODEC = "none"


class Refused(Exception):
    """An update that must be refused; the message is the reason sent back and audited."""


class ReceivedUpdate:
    """A checked update: its pieces again, from memory or from the spool file, one at a time."""

    def __init__(self, plan: list[tuple[str, int, int]], dtypes: Mapping[str, np.dtype], held: list | None,
                 spool: Any, nbytes: int, norm: float | None = None) -> None:
        self.plan, self.dtypes, self.held, self.spool, self.nbytes = plan, dtypes, held, spool, nbytes
        self.norm = norm  # L2 norm of the change from the global model (None: not measured)

    def pieces(self) -> Iterator[tuple[str, int, np.ndarray]]:
        """(tensor, element offset, values) of every piece in order; each spooled piece is read into one reused
        buffer, so fold it before asking for the next."""
        if self.held is not None:
            yield from self.held
            return
        self.spool.seek(0)
        buf = bytearray(max((c * self.dtypes[n].itemsize for n, _, c in self.plan), default=0))
        for name, off, count in self.plan:
            n = count * self.dtypes[name].itemsize
            view = memoryview(buf)[:n]
            if self.spool.readinto(view) != n:
                raise OSError(f"spool file of an update is short at {name!r}+{off}; is the disk full?")
            yield name, off, np.frombuffer(view, self.dtypes[name])

    def close(self) -> None:
        """Drop the held pieces or the spool file."""
        self.held = None
        if self.spool is not None:
            self.spool.close()
            self.spool = None


class GlobalModel:
    """The round's global model as a combiner keeps it to measure each update's change: in memory, or, for a model
    over `spool_over` bytes, in a spool file read back slice by slice (so the page cache holds it, not the
    combiner, which keeps its one model's worth of memory for the running mean)."""

    def __init__(self, weights: Mapping[str, np.ndarray], spool_dir: str | Path, spool_over: int = SPOOL_BYTES
                 ) -> None:
        self.held: dict[str, np.ndarray] | None = None
        self.spool: Any = None
        self.where: dict[str, tuple[int, np.dtype]] = {}
        if sum(w.nbytes for w in weights.values()) <= spool_over:
            self.held = {k: np.ascontiguousarray(v).reshape(-1) for k, v in weights.items()}
            return
        self.spool = tempfile.TemporaryFile(dir=spool_dir)
        at = 0
        for k, v in weights.items():
            self.where[k] = (at, v.dtype)
            self.spool.write(memoryview(np.ascontiguousarray(v).reshape(-1)).cast("B"))
            at += v.nbytes
        self.spool.flush()

    def slice(self, name: str, offset: int, count: int) -> np.ndarray:
        """Elements [offset, offset + count) of tensor `name`, flattened."""
        if self.held is not None:
            return self.held[name][offset : offset + count]
        at, dtype = self.where[name]
        buf = os.pread(self.spool.fileno(), count * dtype.itemsize, at + offset * dtype.itemsize)
        return np.frombuffer(buf, dtype)

    def close(self) -> None:
        """Drop the model (or its spool file)."""
        self.held = None
        if self.spool is not None:
            self.spool.close()
            self.spool = None


# elements squared per BLAS call in `change_sumsq`: small enough that float32 products summed within a block stay
# within about 1e-7 of the float64 sum, large enough that the Python loop costs nothing beside them
SUMSQ_BLOCK = 1 << 13


def change_sumsq(vals: np.ndarray, base: np.ndarray | None) -> float:
    """Squared L2 norm of `vals - base` (of `vals` when `base` is None: a change already).

    float32 values are subtracted and squared in float32 per SUMSQ_BLOCK elements and the blocks summed in float64:
    within about 1e-7 of an all-float64 sum, at a third of its time, and with no float64 copy of the update. A
    block whose float32 sum overflows is summed again in float64; NaN and Inf still make the result non-finite."""
    d = vals if base is None else np.subtract(vals, base, dtype=np.result_type(vals, base))
    if d.dtype not in (np.float32, np.float64):
        d = d.astype(np.float64)
    total = 0.0
    for i in range(0, d.size, SUMSQ_BLOCK):
        x = d[i : i + SUMSQ_BLOCK]
        s = float(np.dot(x, x))
        if not math.isfinite(s) and x.dtype != np.float64:
            x = x.astype(np.float64)
            s = float(np.dot(x, x))
        total += s
    return total


def receive_update(mb: ActorMessenger, peer: Peer, head: ClientUpdate, timeout_s: float, *, codec: str,
                   spool_dir: str | Path, spool_over: int = SPOOL_BYTES,
                   inline: list | None = None, base: GlobalModel | None = None,
                   max_norm: float | None = None) -> ReceivedUpdate:
    """Receive and check the pieces that follow update header `head` from `peer` (decoding them when the job has
    an update codec); Refused with the reason for a malformed, non-finite or incomplete update, or one whose
    change from the global model (`base`; a coded update is a change itself) has an L2 norm over `max_norm`.
    Every piece is read off the channel even after a bad one, so the channel stays in step (`inline`: the pieces
    that came with the header instead). Updates over `spool_over` bytes wait in a file in `spool_dir`."""
    asm = ModelAssembler(head, str(peer))
    plan = asm.plan
    dtypes = {k: d for k, (d, _) in asm.specs.items()}
    coded = codec != NONE_CODEC
    if coded and head.codec != codec:
        raise Refused(f"update encoded with {head.codec!r}, the job's update_codec is {codec!r}; start the "
                      "client with this job's file")
    total = sum(c * dtypes[n].itemsize for n, _, c in plan)
    spool = tempfile.TemporaryFile(dir=spool_dir) if total > spool_over else None
    held: list | None = None if spool is not None else []
    why, nbytes, sumsq = None, 0, 0.0
    measure = coded or base is not None
    incoming = iter(mb.pieces(peer, head, timeout_s, inline))
    try:
        for i, (name, off, count) in enumerate(plan):
            try:
                parts = next(incoming)
            except (TimeoutError, ValueError) as exc:
                raise Refused(f"incomplete update: {exc}") from None
            nbytes += sum(len(p) for p in parts)
            if why is not None:
                continue
            try:
                vals = _decode_piece(parts, asm, i, dtypes[name], count) if coded else _raw_piece(parts, asm, i)
            except ValueError as exc:
                why = str(exc)
                continue
            piece_sumsq = change_sumsq(vals, None if coded else base.slice(name, off, count)) if measure else 0.0
            # a finite sum of squares means every value is finite (NaN or Inf would make it so): the values need
            # a scan of their own only when it is not, or when nothing was measured
            if not (measure and math.isfinite(piece_sumsq)) and not np.isfinite(vals).all():
                why = f"{name!r} holds NaN or Inf; lower the learning rate or clip gradients"
                continue
            if measure:
                sumsq += piece_sumsq
                if max_norm is not None and sumsq > max_norm * max_norm:
                    why = (f"the update's change from the global model has an L2 norm over the job's "
                           f"max_update_norm={max_norm:g} (at least {np.sqrt(sumsq):.4g}); lower the learning rate "
                           "or clip the update")
                    continue
            if spool is not None:
                spool.write(memoryview(vals).cast("B"))
            else:
                held.append((name, off, vals))
        if why is not None:
            raise Refused(why)
    except BaseException:
        if spool is not None:
            spool.close()
        raise
    if spool is not None:
        spool.flush()
    return ReceivedUpdate(plan, dtypes, held, spool, nbytes, float(np.sqrt(sumsq)) if measure else None)


def clip_pieces(pieces: Iterator[tuple[str, int, np.ndarray]], factor: float, base: GlobalModel | None
                ) -> Iterator[tuple[str, int, np.ndarray]]:
    """An update's pieces with its change from the global model scaled by `factor` (differential privacy's clip at
    the combiner): coded pieces are changes already (`base` None); raw ones are weights, base + factor·(w − base).
    Computed in float64, returned in each piece's dtype."""
    for name, off, vals in pieces:
        if factor == 1.0:
            yield name, off, vals
            continue
        v = vals.astype(np.float64)
        if base is None:
            v *= factor
        else:
            b = base.slice(name, off, vals.size).astype(np.float64)
            v -= b
            v *= factor
            v += b
        yield name, off, v.astype(vals.dtype)


def _raw_piece(parts: list, asm: ModelAssembler, i: int) -> np.ndarray:
    if len(parts) != 1:
        raise ValueError(f"expected piece {i} of a model, got a message of {len(parts)} parts")
    return asm.piece(i, parts[0])[2]


def _decode_piece(parts: list, asm: ModelAssembler, i: int, dtype: np.dtype, count: int) -> np.ndarray:
    from nebula.compress import decode_from_frames

    try:
        vals = decode_from_frames(parts, like="numpy", max_bytes=4096 + 4 * count * dtype.itemsize)
    except ValueError as exc:  # CodecError and FrameError are ValueErrors
        raise ValueError(f"compressed piece {i} does not decode ({exc})") from None
    if not isinstance(vals, np.ndarray) or vals.shape != (count,) or vals.dtype != dtype:
        raise ValueError(f"compressed piece {i} of {asm.plan[i][0]!r} decodes to "
                         f"{getattr(vals, 'dtype', '?')}{tuple(getattr(vals, 'shape', ()))}, expected "
                         f"{dtype}({count},)")
    return vals


class UpdateEncoder:
    """A client's side of compressed updates: each piece's change from the global model, encoded with the job's
    codec. One codec instance per piece, kept for the client's lifetime, so `ef(...)` carries each piece's
    residual from round to round (its residuals are keyed by shape, which pieces of one tensor share)."""

    def __init__(self, codec: str, piece_bytes: int) -> None:
        self.spec, self.piece_bytes = codec, piece_bytes  # (a job's update_codec is checked when it is loaded)
        self.codecs: dict[tuple[str, int], Any] = {}

    def frames(self, weights: Mapping[str, np.ndarray], base: Mapping[str, np.ndarray]
               ) -> Iterator[list[bytes | memoryview]]:
        """The wire frames of every piece of `weights - base`, in the pieces' order."""
        from nebula.compress import encode_to_frames, get_codec

        for name, off, count in piece_plan(tensor_specs(weights), self.piece_bytes):
            w = np.ascontiguousarray(weights[name]).reshape(-1)[off : off + count]
            b = np.asarray(base[name]).reshape(-1)[off : off + count]
            codec = self.codecs.get((name, off))
            if codec is None:
                codec = self.codecs[(name, off)] = get_codec(self.spec)
            yield encode_to_frames(codec, (w - b).astype(w.dtype, copy=False))


def spool_dir(workdir: str | Path) -> Path:
    """Where a combiner spools large updates (beside its audit log, on disk rather than in a tmpfs)."""
    d = Path(workdir) / "spool"
    d.mkdir(parents=True, exist_ok=True)
    os.chmod(d, 0o700)
    return d
