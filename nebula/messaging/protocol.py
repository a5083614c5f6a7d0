"""Typed messages: frozen dataclasses in families, one encoder (`encode`) and one decoder (`decode`) for all of them.

A message is a JSON object `{"type": ..., field: value, ...}` on the control lane, optionally followed or joined by
a model (`ModelLayout`: the manifest `tensors` as [name, dtype, shape] entries, `piece_bytes`, and for a model that
travels inside its header's message `inline` and, for compressed pieces, `frames`), or, in FedOptima and OWL, by
one raw part per array (`pack` / `unpack`). Messages come in families, one per receiving role: a receiver decodes
with its own family, so a type it does not accept is refused as unknown. The families of FEDn's rounds are
`TO_CONTROLLER`, `TO_COMBINER` and `TO_CLIENT` (nebula.federated.messages); FedOptima's, OWL's and the data-parallel
leaders' are defined beside their code. A new family (secure aggregation's rounds, say) is a `MessageFamily` and its
`@family.message("name")` classes; see docs/architecture.md, "Typed messages". Nothing here knows a runtime.

Decoding is strict for what peers send each other (types checked, unknown keys refused, missing required
fields refused) except for fields typed `Untrusted`: values a sender chooses that the receiver bounds with its own
rules and refusal reasons (the federated combiner's: `nebula.federated.checks`), kept as sent.
"""
from __future__ import annotations

import base64
import dataclasses
import json
import types
import typing
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping, Sequence, TypeVar

import numpy as np

from nebula.registry import Registry

__all__ = ["Message", "ModelLayout", "MessageFamily", "Malformed", "ProtocolError", "Untrusted", "encode", "decode",
           "to_json", "pack", "unpack", "pack_message", "unpack_message", "LAYOUT_KEYS"]

Untrusted = Any  # a value as the peer sent it: the receiver's checks bound it (see the module docstring)
M = TypeVar("M", bound="Message")
LAYOUT_KEYS = ("inline", "frames", "tensors", "piece_bytes")  # a model's layout, beside a message's own fields
_SHOWN = 40


class ProtocolError(ValueError):
    """A message that does not decode: unknown type, a field missing, of the wrong kind or not of the message.
    `type` is the type it claimed (None: none), `head` the header as sent."""

    def __init__(self, reason: str, type: str | None = None, head: Mapping[str, Any] | None = None) -> None:
        super().__init__(reason)
        self.type, self.head = type, dict(head or {})


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelLayout:
    """The model that follows a message (or comes inside it): manifest, piece size, inline parts, compressed frames.
    `tensors` and `piece_bytes` are kept as sent: the receiver checks them against the model it expects
    (nebula.messaging.pieces.ModelAssembler, nebula.federated.checks)."""

    tensors: Untrusted
    piece_bytes: Untrusted
    inline: bool = False
    frames: tuple[int, ...] | None = None  # parts per piece of an inline model of compressed pieces


@dataclass(frozen=True, kw_only=True, slots=True)
class Message:
    """Base of every message: `TYPE` (the wire's "type") and the layout of a model that comes with it, if any."""

    TYPE: ClassVar[str] = ""
    model: ModelLayout | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Malformed(Message):
    """A header that did not decode, as a receiver's poll hands it over: the type it claimed (None: none), why it
    failed and the header as sent. No family holds it: it never goes on the wire."""

    claimed: str | None
    reason: str
    head: dict[str, Any]


class MessageFamily:
    """The messages one role receives: their types, registered by name (`@FAMILY.message("round")`)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.types: Registry[type[Message]] = Registry(f"{name} message type", known="types", error=ProtocolError)

    @typing.dataclass_transform(kw_only_default=True, frozen_default=True)
    def message(self, type_name: str) -> Callable[[type[M]], type[M]]:
        """Class decorator: `cls` (made a frozen, keyword-only dataclass) is this family's message `type_name`; a
        class may serve several families."""
        def deco(cls: type[M]) -> type[M]:
            if "__dataclass_fields__" not in cls.__dict__:
                cls = dataclass(frozen=True, kw_only=True, slots=True)(cls)
            if cls.TYPE and cls.TYPE != type_name:
                raise ValueError(f"{cls.__name__} is message type {cls.TYPE!r}, not {type_name!r}")
            cls.TYPE = type_name
            self.types.add(type_name, cls)
            return cls
        return deco

    def __repr__(self) -> str:
        return f"MessageFamily({self.name!r})"


def encode(msg: Message) -> dict[str, Any]:
    """The wire form of `msg`: {"type", its fields in order, then its model's layout}."""
    out: dict[str, Any] = {"type": msg.TYPE}
    for f in dataclasses.fields(msg):
        if f.name != "model":
            out[f.name] = _plain(getattr(msg, f.name))
    if msg.model is not None:
        m = msg.model
        if m.inline:
            out["inline"] = True
        if m.frames is not None:
            out["frames"] = list(m.frames)
        out["tensors"], out["piece_bytes"] = m.tensors, m.piece_bytes
    return out


def to_json(msg: Message | Mapping[str, Any]) -> bytes:
    """The header bytes of a message (a raw mapping is sent as it is: tests and tools speak for attackers)."""
    head = encode(msg) if isinstance(msg, Message) else dict(msg)
    return json.dumps(head, separators=(",", ":")).encode()


def decode(head: Any, family: MessageFamily) -> Message:
    """The message of `family` that header `head` (a parsed JSON object) holds; ProtocolError naming the problem."""
    if not isinstance(head, dict):
        raise ProtocolError(f"a message header must be a JSON object, got {type(head).__name__}")
    kind = head.get("type")
    if not isinstance(kind, str):
        raise ProtocolError(f"message without a type (got {_show(kind)})", None, head)
    if kind not in family.types:
        raise ProtocolError(family.types.unknown(kind[:_SHOWN]), kind, head)
    cls = family.types.get(kind)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = _hints(cls)
    extra = sorted(k for k in head if k not in fields and k not in LAYOUT_KEYS and k != "type")
    if extra:
        raise ProtocolError(f"{kind}: unknown field {_show(extra[0])}", kind, head)
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        if name == "model":
            continue
        if name in head:
            kwargs[name] = _convert(hints[name], head[name], f"{kind}.{name}", kind, head)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ProtocolError(f"{kind}: required field {name} missing", kind, head)
    if "tensors" in head or "piece_bytes" in head:
        kwargs["model"] = ModelLayout(
            tensors=head.get("tensors"), piece_bytes=head.get("piece_bytes"),
            inline=_convert(bool, head.get("inline", False), f"{kind}.inline", kind, head),
            frames=_convert(tuple[int, ...] | None, head.get("frames"), f"{kind}.frames", kind, head))
    return cls(**kwargs)


# ---- arrays after a header (FedOptima, OWL) ----------------------------------------------------------------------
def pack(header: Mapping[str, Any], arrays: Mapping[str, np.ndarray] | None = None) -> list:
    """Parts for Channel.send: the header (with each array's name, dtype and shape), then the arrays' bytes."""
    arrays = arrays or {}
    head = dict(header)
    head["arrays"] = [[k, str(np.asarray(v).dtype), list(np.shape(v))] for k, v in arrays.items()]
    parts: list = [json.dumps(head, separators=(",", ":")).encode()]
    parts += [memoryview(np.ascontiguousarray(v)).cast("B") for v in arrays.values()]
    return parts


def unpack(parts: Sequence[memoryview | bytes], who: str = "peer") -> tuple[dict, dict[str, np.ndarray]]:
    """(header, arrays) of a message made by `pack`; ProtocolError naming `who` and the problem."""
    try:
        head = json.loads(bytes(parts[0]))
        specs = head.pop("arrays")
        if not isinstance(head, dict) or "type" not in head or len(specs) != len(parts) - 1:
            raise ValueError("header without a type, or a part count that differs from its array list")
        arrays = {}
        for (name, dtype, shape), raw in zip(specs, parts[1:]):
            a = np.frombuffer(raw, dtype=np.dtype(dtype))
            arrays[str(name)] = a.reshape([int(s) for s in shape]).copy()
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
        raise ProtocolError(f"malformed message from {who}: {exc}; peers must send pack()ed messages") from None
    return head, arrays


def pack_message(msg: Message, arrays: Mapping[str, np.ndarray] | None = None) -> list:
    """`pack` of a typed message."""
    return pack(encode(msg), arrays)


def unpack_message(parts: Sequence[memoryview | bytes], family: MessageFamily, who: str = "peer"
                   ) -> tuple[Message, dict[str, np.ndarray]]:
    """The typed message of `family` and its arrays; ProtocolError naming `who` and the problem."""
    head, arrays = unpack(parts, who)
    try:
        return decode(head, family), arrays
    except ProtocolError as exc:
        raise ProtocolError(f"from {who}: {exc}", exc.type, exc.head) from None


# ---- field conversion -------------------------------------------------------------------------------------------
_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _plain(v: Any) -> Any:
    if isinstance(v, bytes):
        return base64.b64encode(v).decode("ascii")  # bytes fields (keys, sealed shares) travel as base64 text
    return list(_plain(x) for x in v) if isinstance(v, tuple) else v


def _convert(tp: Any, v: Any, path: str, kind: str, head: Mapping[str, Any]) -> Any:
    """`v` as type `tp` (str, int, float, bool, bytes as base64, None, tuple[X, ...], dict, unions; Any keeps it as
    sent)."""
    if tp is Any:
        return v
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if v is None and type(None) in args:
            return None
        for arg in (a for a in args if a is not type(None)):
            try:
                return _convert(arg, v, path, kind, head)
            except ProtocolError:
                continue
        raise ProtocolError(f"{path}: {_show(v)} is not {_name(tp)}", kind, head)
    if origin is tuple:
        if not isinstance(v, list):
            raise ProtocolError(f"{path}: expected a list, got {_show(v)}", kind, head)
        each = [args[0]] * len(v) if len(args) == 2 and args[1] is Ellipsis else list(args)
        if len(each) != len(v):
            raise ProtocolError(f"{path}: expected {len(each)} items, got {_show(v)}", kind, head)
        return tuple(_convert(t, x, f"{path}[{i}]", kind, head) for i, (t, x) in enumerate(zip(each, v)))
    if tp is bytes:
        if isinstance(v, str):
            try:
                return base64.b64decode(v, validate=True)
            except ValueError:
                pass
        raise ProtocolError(f"{path}: expected base64 bytes, got {_show(v)}", kind, head)
    base = origin or tp
    ok = (isinstance(v, base) and not (isinstance(v, bool) and base is not bool)) \
        or (base is float and isinstance(v, int) and not isinstance(v, bool))
    if not ok:
        raise ProtocolError(f"{path}: expected {_name(tp)}, got {_show(v)}", kind, head)
    return float(v) if base is float else v


def _name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def _show(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= _SHOWN else r[: _SHOWN - 3] + "..."
