"""Self-describing wire format: one header frame (codec tree, dtypes, shapes) followed by one frame per payload array."""
from __future__ import annotations

import json
from typing import Any, Sequence

import numpy as np

from . import backend as B
from .base import Codec, CodecError, Encoded, decode_encoded, get_codec
from .encoded import HEADER_PREFIX, MAGIC, build_header

__all__ = ["FrameError", "MAGIC", "build_header", "encoded_to_frames", "encode_to_frames", "frames_to_encoded",
           "decode_from_frames", "TensorCoder"]

_MAX_HEADER = 1 << 20
_MAX_DEPTH = 16
DEFAULT_MAX_BYTES = 1 << 34  # 16 GiB: a sanity bound against corrupted or hostile headers


class FrameError(CodecError):
    """Frames that do not parse as an encoded tensor (truncated, corrupted, or from another protocol)."""


def _byte_view(a: Any) -> memoryview:
    h = B.to_host(a)
    return memoryview(h.reshape(-1).view(np.uint8))


def encoded_to_frames(enc: Encoded) -> list[bytes | memoryview]:
    """Header plus zero-copy views of the payloads (GPU payloads are copied to the host once)."""
    return [enc.header] + [_byte_view(a) for a in enc.leaves()]


def encode_to_frames(codec: Codec | str, x: Any) -> list[bytes | memoryview]:
    """Encode x with `codec` (pass an instance to keep a stateful codec's state) and return its wire frames."""
    return encoded_to_frames(get_codec(codec).encode(x))


def _shape(v: Any, where: str) -> tuple[int, ...]:
    if not isinstance(v, list) or len(v) > 32 or not all(isinstance(d, int) and d >= 0 for d in v):
        raise FrameError(f"malformed header: {where} shape {v!r} is not a list of non-negative ints")
    return tuple(v)


def _dtype(v: Any, where: str) -> str:
    if v not in B.WIRE_DTYPES:
        raise FrameError(f"malformed header: {where} dtype {v!r} is unknown; known: {', '.join(B.WIRE_DTYPES)}")
    return v


def _parse_node(node: Any, payloads: list[tuple[str, tuple[int, ...]]], depth: int) -> dict[str, Any]:
    if depth > _MAX_DEPTH or not isinstance(node, dict) or not {"c", "d", "s", "p"} <= node.keys():
        raise FrameError("malformed header: codec node must be an object with keys c, d, s, p (nested at most "
                         f"{_MAX_DEPTH} deep)")
    if not isinstance(node["c"], str) or not isinstance(node["p"], list):
        raise FrameError("malformed header: codec name must be a string and parts a list")
    parts = []
    for item in node["p"]:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str) and isinstance(item[1], dict)):
            raise FrameError(f"malformed header: part {item!r} is not [name, description]")
        name, desc = item
        if "a" in desc:
            payloads.append((_dtype(desc["a"], f"part {name!r}"), _shape(desc.get("s"), f"part {name!r}")))
            parts.append((name, len(payloads) - 1))
        else:
            parts.append((name, _parse_node(desc, payloads, depth + 1)))
    meta = node.get("m", {})
    if not isinstance(meta, dict):
        raise FrameError("malformed header: meta must be an object")
    return {"c": node["c"], "d": _dtype(node["d"], "node"), "s": _shape(node["s"], "node"), "m": meta, "p": parts}


def _read_header(first: Any) -> tuple[dict[str, Any], int]:
    mv = memoryview(first).cast("B")
    if len(mv) < HEADER_PREFIX.size:
        raise FrameError(f"first frame has {len(mv)} bytes, shorter than the {HEADER_PREFIX.size}-byte prefix; not an "
                         "encoded tensor")
    magic, length = HEADER_PREFIX.unpack(mv[: HEADER_PREFIX.size])
    if magic != MAGIC:
        raise FrameError(f"bad magic {bytes(magic)!r} (expected {MAGIC!r}): these frames are not an encoded tensor "
                         "or come from an incompatible version")
    if length > _MAX_HEADER or HEADER_PREFIX.size + length > len(mv):
        raise FrameError(f"header length {length} exceeds the frame ({len(mv)} bytes); the frame is truncated")
    try:
        doc = json.loads(bytes(mv[HEADER_PREFIX.size: HEADER_PREFIX.size + length]))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FrameError(f"header is not valid JSON ({exc}); the frame is corrupted") from None
    if not isinstance(doc, dict) or doc.get("v") != 1 or doc.get("kind") not in ("numpy", "paddle"):
        raise FrameError("header lacks version 1 / kind numpy|paddle; sender and receiver versions differ")
    return doc, HEADER_PREFIX.size + length


def _root_dtype(frames: Sequence[Any]) -> str:
    """The dtype the frames decode to, read from their header (unchecked: frames_to_encoded validates it)."""
    doc, _ = _read_header(frames if isinstance(frames, (bytes, bytearray, memoryview)) else frames[0])
    tree = doc.get("tree")
    return str(tree.get("d")) if isinstance(tree, dict) else ""


def _check_sizes(node: dict[str, Any], max_bytes: int) -> None:
    size = int(np.prod(node["s"], dtype=np.float64)) * B.WIRE_DTYPES[node["d"]]
    if size > max_bytes:
        raise FrameError(f"frames declare a {node['d']} tensor of shape {list(node['s'])} ({size} bytes), more than "
                         f"max_bytes={max_bytes}; raise max_bytes if this tensor is expected")
    for _, v in node["p"]:
        if isinstance(v, dict):
            _check_sizes(v, max_bytes)


def frames_to_encoded(frames: Sequence[Any], like: str | None = None, place: Any = None,
                      max_bytes: int = DEFAULT_MAX_BYTES) -> Encoded:
    """Parse wire frames back into an Encoded tree (payloads become views of the frames where possible).

    A tensor that would decode to more than `max_bytes` is refused before anything is allocated.
    """
    if isinstance(frames, (bytes, bytearray, memoryview)):
        frames = [frames]
    if not frames:
        raise FrameError("no frames given; expected a header frame and payload frames")
    doc, header_len = _read_header(frames[0])
    kind = like or doc["kind"]
    if kind not in ("numpy", "paddle"):
        raise FrameError(f"like={like!r}: use 'numpy', 'paddle' or None (the sender's kind)")
    payloads: list[tuple[str, tuple[int, ...]]] = []
    tree = _parse_node(doc.get("tree"), payloads, 0)
    _check_sizes(tree, max_bytes)
    sizes = [int(np.prod(s, dtype=np.int64)) * B.WIRE_DTYPES[d] for d, s in payloads]
    bufs = [memoryview(f).cast("B") for f in frames[1:]]
    first_rest = memoryview(frames[0]).cast("B")[header_len:]
    if len(first_rest) == 0 and len(bufs) == len(sizes) and all(len(b) == n for b, n in zip(bufs, sizes)):
        views = bufs
    else:
        stream = first_rest if not bufs else memoryview(b"".join([first_rest, *bufs]))
        if len(stream) != sum(sizes):
            raise FrameError(f"payload is {len(stream)} bytes but the header declares {sum(sizes)}; frames were "
                             "truncated, reordered or mixed with another message")
        views, off = [], 0
        for n in sizes:
            views.append(stream[off: off + n])
            off += n
    arrays = []
    for (dt, shape), view in zip(payloads, views):
        a = np.frombuffer(view, dtype=np.uint16 if dt == "bfloat16" else dt).reshape(shape)
        arrays.append(B.from_host(a, dt, kind, place))

    def build(node: dict[str, Any], root: bool) -> Encoded:
        parts = {name: build(v, False) if isinstance(v, dict) else arrays[v] for name, v in node["p"]}
        return Encoded(node["c"], node["d"], node["s"], parts, dict(node["m"]), kind,
                       doc.get("spec") if root else None)

    return build(tree, True)


def decode_from_frames(frames: Sequence[Any], like: str | None = None, place: Any = None,
                       max_bytes: int = DEFAULT_MAX_BYTES) -> Any:
    """Decode wire frames to a numpy array or paddle.Tensor (like=None: the sender's kind; place: paddle device)."""
    return _decode_checked(frames_to_encoded(frames, like, place, max_bytes))


def _decode_checked(enc: Encoded, writable: bool = True) -> Any:
    """decode_encoded(enc), with a payload that does not fit its codec reported as corrupted frames (writable=False: a
    numpy result may still be a read-only view of the frames, for a caller that copies it anyway)."""
    try:
        y = decode_encoded(enc)
    except CodecError:
        raise
    except (KeyError, ValueError, TypeError, IndexError) as exc:
        raise FrameError(f"frames declare codec {enc.codec!r} but its parts do not fit it ({exc!r}); the frames "
                         "are corrupted or come from an incompatible version") from None
    if writable and isinstance(y, np.ndarray) and not y.flags.writeable:
        y = y.copy()  # payload views of read-only frames must not leak out as read-only arrays
    return y


class TensorCoder:
    """The one tensor <-> frames path of a channel direction (Channel.send_tensor/recv_tensor, the pipeline's
    boundaries): one codec instance per spec, so stateful codecs (ef, lowrank, auto) keep their state per direction."""

    def __init__(self) -> None:
        self._codecs: dict[str, Codec] = {}

    def codec(self, codec: Codec | str) -> Codec:
        """This direction's instance for spec `codec` (made on first use); a Codec instance passes through."""
        if isinstance(codec, Codec):
            return codec
        c = self._codecs.get(codec)
        if c is None:
            c = self._codecs[codec] = get_codec(codec)
        return c

    def encode(self, x: Any, codec: Codec | str = "none") -> list[bytes | memoryview]:
        """Encode x (numpy array or paddle.Tensor) with this direction's `codec` into wire frames; a paddle.Tensor
        is encoded where `backend.codec_path` says (paddle ops on an accelerator, numpy for a CPU tensor)."""
        if B.is_paddle(x) and B.codec_path(x.place, B.dtype_name(x)) == "numpy":
            x = B.to_host(x)  # zero-copy view of the CPU tensor
        return encoded_to_frames(self.codec(codec).encode(x))

    def decode(self, frames: Sequence[Any], codec: Codec | str | None = None, like: str | None = None) -> Any:
        """Decode wire frames: statelessly (the frames name their codec) unless a Codec instance is given.

        like='paddle' gives a paddle.Tensor on this process's device, decoded where `backend.codec_path` says.
        """
        kind = like
        if like == "paddle" and B.codec_path(B.current_device(), _root_dtype(frames)) == "numpy":
            kind = "numpy"
        enc = frames_to_encoded(frames, kind)
        y = codec.decode(enc) if isinstance(codec, Codec) else _decode_checked(enc, writable=kind == like)
        return B.from_host(np.ascontiguousarray(y), B.dtype_name(y), like) if kind != like else y  # (one copy)
