"""Typed messages: frozen dataclasses in families, one encoder (`encode`) and one decoder (`decode`) for all of them.

A message is a JSON object `{"type": ..., field: value, ...}` on the control lane, optionally followed or joined by
a model (`ModelLayout`: the manifest `tensors` as [name, dtype, shape] entries, `piece_bytes`, and for a model that
travels inside its header's message `inline` and, for compressed pieces, `frames`), or, in FedOptima and OWL, by
one raw part per array (`pack` / `unpack`). A message's fields may be frozen dataclasses themselves (nested, as
JSON objects, decoded as strictly as the message); a bytes field declared `raw_field()` travels, with the message's
other raw fields in field order, in one raw part right after the header (the header holds its length:
`encode_parts` / `decode_parts`); a field declared `local_field()` never travels (the receiver fills it in: a masked
update's words, say, which follow as a model). Messages come in families, one per receiving role: a receiver
decodes with its own family, so a type it does not accept is refused as unknown. The families of FEDn's rounds are
`TO_CONTROLLER`, `TO_COMBINER` and `TO_CLIENT` (nebula.federated.messages), which include secure aggregation's
(nebula.federated.secagg.messages); FedOptima's, OWL's and the data-parallel leaders' are defined beside their
code. A new family is a `MessageFamily` and its `@family.message("name")` classes (a family may `include` another's
types); see docs/architecture.md, "Typed messages". Nothing here knows a runtime.

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
           "to_json", "pack", "unpack", "pack_message", "unpack_message", "LAYOUT_KEYS", "raw_field", "local_field",
           "encode_parts", "decode_parts"]

Untrusted = Any  # a value as the peer sent it: the receiver's checks bound it (see the module docstring)
M = TypeVar("M", bound="Message")
LAYOUT_KEYS = ("inline", "frames", "tensors", "piece_bytes")  # a model's layout, beside a message's own fields
_SHOWN = 40
_WIRE = "nebula.wire"  # a field's metadata key: RAW (in the raw part) or LOCAL (never on the wire)
RAW, LOCAL = "raw", "local"


def raw_field(**kw: Any) -> Any:
    """A bytes field that travels in the message's raw part after the header, not as base64 text in it."""
    return dataclasses.field(metadata={_WIRE: RAW}, **kw)


def local_field(default: Any = None) -> Any:
    """A field that never travels: the receiver fills it in (from a model that follows, say)."""
    return dataclasses.field(default=default, metadata={_WIRE: LOCAL})


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

    @property
    def to(self) -> str | None:
        """The process its header names (`to`), if it names one: a receiver that takes only what is addressed to
        it still hears of a malformed message meant for it."""
        to = self.head.get("to")
        return to if isinstance(to, str) else None


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

    def include(self, other: MessageFamily) -> None:
        """Every type of `other` is one of this family too (a capability's messages joining a role's inbox)."""
        for name in other.types:
            self.types.add(name, other.types.get(name))

    def __repr__(self) -> str:
        return f"MessageFamily({self.name!r})"


def encode(msg: Message) -> dict[str, Any]:
    """The wire form of `msg`: {"type", its fields in order, then its model's layout} (a raw field as its length:
    `encode_parts` gives the raw part too)."""
    return _encode(msg, [])


def encode_parts(msg: Message) -> list[bytes]:
    """The parts of `msg` on the wire: its header, then its raw fields joined in one part (none when they are
    empty)."""
    raw: list[bytes] = []
    head = json.dumps(_encode(msg, raw), separators=(",", ":")).encode()
    blob = b"".join(raw)
    return [head, blob] if blob else [head]


def _encode(msg: Message, raw: list[bytes]) -> dict[str, Any]:
    out: dict[str, Any] = {"type": msg.TYPE, **_fields_out(msg, raw)}
    if msg.model is not None:
        m = msg.model
        if m.inline:
            out["inline"] = True
        if m.frames is not None:
            out["frames"] = list(m.frames)
        out["tensors"], out["piece_bytes"] = m.tensors, m.piece_bytes
    return out


def _wire_fields(cls: type) -> list[dataclasses.Field]:
    """The fields of dataclass `cls` that travel: not a message's model layout, not a local field."""
    return [f for f in dataclasses.fields(cls) if f.metadata.get(_WIRE) != LOCAL
            and not (f.name == "model" and issubclass(cls, Message))]


def _fields_out(obj: Any, raw: list[bytes]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in _wire_fields(type(obj)):
        v = getattr(obj, f.name)
        if f.metadata.get(_WIRE) == RAW:
            raw.append(bytes(v))
            out[f.name] = len(v)
        else:
            out[f.name] = _plain(v, raw)
    return out


def to_json(msg: Message | Mapping[str, Any]) -> bytes:
    """The header bytes of a message (a raw mapping is sent as it is: tests and tools speak for attackers); a
    message with raw fields goes with `encode_parts`."""
    head = encode(msg) if isinstance(msg, Message) else dict(msg)
    return json.dumps(head, separators=(",", ":")).encode()


def decode(head: Any, family: MessageFamily, parts: Sequence[bytes | memoryview] | None = None) -> Message:
    """The message of `family` that header `head` (a parsed JSON object) holds, its raw fields cut from the first of
    `parts` (the parts after the header); ProtocolError naming the problem."""
    return decode_parts(head, family, parts)[0]


def decode_parts(head: Any, family: MessageFamily, parts: Sequence[bytes | memoryview] | None = None
                 ) -> tuple[Message, list | None]:
    """(the message of `family` in header `head`, the parts after its raw part: an inline model's pieces, a
    payload); ProtocolError naming the problem (a raw part shorter or longer than its fields say, among others)."""
    if not isinstance(head, dict):
        raise ProtocolError(f"a message header must be a JSON object, got {type(head).__name__}")
    kind = head.get("type")
    if not isinstance(kind, str):
        raise ProtocolError(f"message without a type (got {_show(kind)})", None, head)
    if kind not in family.types:
        raise ProtocolError(family.types.unknown(kind[:_SHOWN]), kind, head)
    cls = family.types.get(kind)
    rd = _RawReader(list(parts or ()), kind, head)
    kwargs = _kwargs(cls, head, kind, rd, LAYOUT_KEYS + ("type",))
    if "tensors" in head or "piece_bytes" in head:
        kwargs["model"] = ModelLayout(
            tensors=head.get("tensors"), piece_bytes=head.get("piece_bytes"),
            inline=_convert(bool, head.get("inline", False), f"{kind}.inline", rd),
            frames=_convert(tuple[int, ...] | None, head.get("frames"), f"{kind}.frames", rd))
    return _build(cls, kwargs, kind, rd), rd.rest()


class _RawReader:
    """The raw part after a header, cut field by field in the order the fields were encoded."""

    def __init__(self, parts: list, kind: str, head: Mapping[str, Any]) -> None:
        self.parts, self.kind, self.head = parts, kind, head
        self.data: memoryview | None = None
        self.at = 0

    def error(self, reason: str) -> ProtocolError:
        return ProtocolError(reason, self.kind, self.head)

    def take(self, n: Any, path: str) -> bytes:
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise self.error(f"{path}: expected a raw field's length, got {_show(n)}")
        if n == 0:
            return b""
        if self.data is None:
            if not self.parts:
                raise self.error(f"{path}: {n} raw bytes announced, but no raw part follows the header")
            self.data = memoryview(self.parts[0]).cast("B")
        if self.at + n > len(self.data):
            raise self.error(f"{path}: {n} raw bytes announced at offset {self.at}, the raw part holds "
                             f"{len(self.data)}")
        self.at += n
        return bytes(self.data[self.at - n:self.at])

    def rest(self) -> list | None:
        if self.data is None:
            return self.parts or None
        if self.at != len(self.data):
            raise self.error(f"{self.kind}: a raw part of {len(self.data)} bytes, its fields announce {self.at}")
        return self.parts[1:] or None


def _kwargs(cls: type, src: Mapping[str, Any], path: str, rd: _RawReader, allowed: tuple[str, ...] = ()
            ) -> dict[str, Any]:
    """The wire fields of dataclass `cls` read from `src` (strict: unknown keys refused, required ones present)."""
    fields = {f.name: f for f in _wire_fields(cls)}
    hints = _hints(cls)
    extra = sorted(k for k in src if k not in fields and k not in allowed)
    if extra:
        raise rd.error(f"{path}: unknown field {_show(extra[0])}")
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        if name in src:
            at = f"{path}.{name}"
            kwargs[name] = rd.take(src[name], at) if f.metadata.get(_WIRE) == RAW else \
                _convert(hints[name], src[name], at, rd)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise rd.error(f"{path}: required field {name} missing")
    return kwargs


def _build(cls: type, kwargs: dict[str, Any], path: str, rd: _RawReader) -> Any:
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:  # a class's own check of its values
        raise rd.error(f"{path}: {exc}") from None


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


def _plain(v: Any, raw: list[bytes]) -> Any:
    if isinstance(v, bytes):
        return base64.b64encode(v).decode("ascii")  # bytes fields (keys, sealed shares) travel as base64 text
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return _fields_out(v, raw)  # a nested dataclass: a JSON object of its fields
    return list(_plain(x, raw) for x in v) if isinstance(v, tuple) else v


def _convert(tp: Any, v: Any, path: str, rd: _RawReader) -> Any:
    """`v` as type `tp` (str, int, float, bool, bytes as base64, None, tuple[X, ...], dict, unions, frozen
    dataclasses as JSON objects; Any keeps it as sent)."""
    if tp is Any:
        return v
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if v is None and type(None) in args:
            return None
        for arg in (a for a in args if a is not type(None)):
            at = (rd.data, rd.at)
            try:
                return _convert(arg, v, path, rd)
            except ProtocolError:
                rd.data, rd.at = at  # (a branch that failed gives back the raw bytes it cut)
                continue
        raise rd.error(f"{path}: {_show(v)} is not {_name(tp)}")
    if origin is tuple:
        if not isinstance(v, list):
            raise rd.error(f"{path}: expected a list, got {_show(v)}")
        each = [args[0]] * len(v) if len(args) == 2 and args[1] is Ellipsis else list(args)
        if len(each) != len(v):
            raise rd.error(f"{path}: expected {len(each)} items, got {_show(v)}")
        return tuple(_convert(t, x, f"{path}[{i}]", rd) for i, (t, x) in enumerate(zip(each, v)))
    if tp is bytes:
        if isinstance(v, str):
            try:
                return base64.b64decode(v, validate=True)
            except ValueError:
                pass
        raise rd.error(f"{path}: expected base64 bytes, got {_show(v)}")
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(v, dict):
            raise rd.error(f"{path}: expected an object ({tp.__name__}), got {_show(v)}")
        return _build(tp, _kwargs(tp, v, path, rd), path, rd)
    base = origin or tp
    ok = (isinstance(v, base) and not (isinstance(v, bool) and base is not bool)) \
        or (base is float and isinstance(v, int) and not isinstance(v, bool))
    if not ok:
        raise rd.error(f"{path}: expected {_name(tp)}, got {_show(v)}")
    return float(v) if base is float else v


def _name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def _show(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= _SHOWN else r[: _SHOWN - 3] + "..."
