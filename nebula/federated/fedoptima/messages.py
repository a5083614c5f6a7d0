"""Messages of the FedOptima and OWL modes on a channel: one JSON header part, then one raw part per array."""
from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

import numpy as np

__all__ = ["pack", "unpack", "MessageError"]


class MessageError(ValueError):
    """A message that does not parse (not ours, truncated, or arrays that do not match their header)."""


def pack(header: Mapping[str, Any], arrays: Mapping[str, np.ndarray] | None = None) -> list:
    """Parts for Channel.send: the header (with each array's name, dtype and shape), then the arrays' bytes."""
    arrays = arrays or {}
    head = dict(header)
    head["arrays"] = [[k, str(np.asarray(v).dtype), list(np.shape(v))] for k, v in arrays.items()]
    parts: list = [json.dumps(head, separators=(",", ":")).encode()]
    parts += [memoryview(np.ascontiguousarray(v)).cast("B") for v in arrays.values()]
    return parts


def unpack(parts: Sequence[memoryview | bytes], who: str = "peer") -> tuple[dict, dict[str, np.ndarray]]:
    """(header, arrays) of a message made by `pack`; MessageError naming `who` and the problem."""
    try:
        head = json.loads(bytes(parts[0]))
        specs = head.pop("arrays")
        if not isinstance(head, dict) or "type" not in head or len(specs) != len(parts) - 1:
            raise ValueError("header without a type, or a part count that differs from its array list")
        arrays = {}
        for (name, dtype, shape), raw in zip(specs, parts[1:]):
            a = np.frombuffer(raw, dtype=np.dtype(dtype))
            arrays[str(name)] = a.reshape([int(s) for s in shape]).copy()
    except (ValueError, TypeError, KeyError, IndexError, json.JSONDecodeError) as exc:
        raise MessageError(f"malformed message from {who}: {exc}; peers must send pack()ed messages") from None
    return head, arrays
