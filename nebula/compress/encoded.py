"""The Encoded tree (a compressed tensor) and its self-describing header frame, below codecs and the frame parser."""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import Any, Iterator

from . import backend as B

__all__ = ["Encoded", "raw_encoded", "build_header", "MAGIC", "HEADER_PREFIX"]

MAGIC = b"NBC1"
HEADER_PREFIX = struct.Struct("<4sI")  # magic, JSON length


@dataclass(eq=False)
class Encoded:
    """A compressed tensor: a tree whose leaves are arrays (numpy or paddle) and whose nodes name their codec.

    `codec` is the spec that decodes this node without any state; `dtype`/`shape` are what it decodes to;
    `parts` maps names to arrays or child nodes; `meta` holds small JSON scalars; `kind` is 'numpy' or 'paddle';
    `spec` (root only) is the full spec of the codec that produced it.
    """

    codec: str
    dtype: str
    shape: tuple[int, ...]
    parts: dict[str, Any]
    meta: dict[str, Any] = field(default_factory=dict)
    kind: str = "numpy"
    spec: str | None = None
    _header: bytes | None = field(default=None, repr=False)

    def leaves(self) -> Iterator[Any]:
        """Payload arrays in wire order (depth first, parts in insertion order)."""
        for v in self.parts.values():
            if isinstance(v, Encoded):
                yield from v.leaves()
            else:
                yield v

    @property
    def payload_nbytes(self) -> int:
        """Bytes of all payload arrays."""
        return sum(B.nbytes_of(a) for a in self.leaves())

    @property
    def header(self) -> bytes:
        """The serialised self-describing header frame (built once)."""
        if self._header is None:
            self._header = build_header(self)
        return self._header

    @property
    def nbytes(self) -> int:
        """Exact number of bytes this tensor occupies on the wire: header plus every payload."""
        return len(self.header) + self.payload_nbytes


def raw_encoded(x: Any, spec: str | None = "none") -> Encoded:
    """Lossless passthrough node (integer, bool, empty tensors and the `none` codec)."""
    return Encoded("none", B.dtype_name(x), B.shape_of(x), {"data": x}, kind=B.kind_of(x), spec=spec)


def _node_json(enc: Encoded) -> dict[str, Any]:
    parts = []
    for name, v in enc.parts.items():
        if isinstance(v, Encoded):
            parts.append([name, _node_json(v)])
        else:
            parts.append([name, {"a": B.wire_dtype_name(v), "s": list(B.shape_of(v))}])
    node: dict[str, Any] = {"c": enc.codec, "d": enc.dtype, "s": list(enc.shape), "p": parts}
    if enc.meta:
        node["m"] = enc.meta
    return node


def build_header(enc: Encoded) -> bytes:
    """The header frame of `enc`: magic, JSON length, JSON describing the codec tree and every payload."""
    doc = {"v": 1, "spec": enc.spec or enc.codec, "kind": enc.kind, "tree": _node_json(enc)}
    body = json.dumps(doc, separators=(",", ":")).encode()
    return HEADER_PREFIX.pack(MAGIC, len(body)) + body
