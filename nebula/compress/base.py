"""Codec interface, the registry of codecs by name, and stateless decoding (the Encoded tree lives in `encoded`)."""
from __future__ import annotations

import functools
import math
from abc import ABC, abstractmethod
from dataclasses import replace
from typing import Any, Callable, ClassVar, Mapping

import numpy as np

from nebula.registry import Registry

from . import backend as B
from .encoded import Encoded, raw_encoded
from .inflation import check_inflation
from .spec import SpecError, SpecNode, format_spec, parse_spec

__all__ = [
    "Codec", "ElementCodec", "Encoded", "CodecError", "NonFiniteError", "SpecError", "register_codec", "get_codec",
    "known_codecs", "decode_encoded", "relative_error", "check_finite", "raw_encoded", "INNER_PREFIX", "nest_state",
    "split_state",
]


class CodecError(ValueError):
    """An input cannot be encoded, or an Encoded cannot be decoded; the message names the problem and the fix."""


class NonFiniteError(CodecError):
    """A lossy codec was given NaN or Inf values (they would decode as garbage)."""


def check_finite(x: Any, spec: str) -> float:
    """Return max|x|, raising NonFiniteError if x holds NaN or Inf (x is float and non-empty)."""
    if B.is_paddle(x):
        import paddle

        amax = float(paddle.max(paddle.abs(x)))
        if not math.isfinite(amax) or bool(paddle.isnan(x).any()):
            _raise_nonfinite(int(paddle.isnan(x).sum()), int(paddle.isinf(x).sum()), spec)
        return amax
    amax = float(max(x.max(), -x.min()))
    if not math.isfinite(amax):
        _raise_nonfinite(int(np.isnan(x).sum()), int(np.isinf(x).sum()), spec)
    return amax


def _raise_nonfinite(num_nan: int, num_inf: int, spec: str) -> None:
    raise NonFiniteError(
        f"codec {spec!r}: input holds {num_nan} NaN and {num_inf} Inf values; lossy compression would send "
        f"garbage. Fix the diverging computation (lower the learning rate, clip gradients) or send with codec 'none'")


def relative_error(x: Any, y: Any) -> float:
    """||x - y|| / ||x|| in float64 (0 when both are zero, inf when only x is)."""
    if B.is_paddle(x):
        x = x.numpy()
    if B.is_paddle(y):
        y = y.numpy()
    x = np.asarray(x, dtype=np.float64).ravel()
    y = np.asarray(y, dtype=np.float64).ravel()
    den = float(np.linalg.norm(x))
    num = float(np.linalg.norm(x - y))
    if den == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return num / den


class Codec(ABC):
    """A compressor/decompressor named by a spec string; stateful codecs keep state per instance."""

    name: ClassVar[str]
    lossy: ClassVar[bool] = True
    raw_parts: ClassVar[bool] = False  # True: `_decode` gets its child nodes undecoded (a lossless outer stage)

    @property
    @abstractmethod
    def spec(self) -> str:
        """Canonical spec string of this codec instance."""

    @classmethod
    @abstractmethod
    def from_spec(cls, node: SpecNode) -> "Codec":
        """Build the codec from a parsed spec, validating its arguments."""

    def encode(self, x: Any) -> Encoded:
        """Compress x (numpy array or paddle.Tensor); integer, bool and empty tensors pass through losslessly."""
        x = _check_input(x, self.spec)
        dt = B.dtype_name(x)
        if not self.lossy or not B.is_float_dtype(dt) or B.numel(x) == 0:
            return raw_encoded(x, self.spec)
        enc = self._encode(B.cast(x, B.compute_dtype(dt)))
        enc = replace(enc, dtype=dt, shape=B.shape_of(x), kind=B.kind_of(x), spec=self.spec, _header=None)
        check_inflation(self.spec, x, enc.nbytes, get_codec)  # warns once per shape when the encoding outgrows the tensor
        return enc

    def decode(self, enc: Encoded) -> Any:
        """Decompress to the same kind, shape and dtype as the encoded input."""
        return decode_encoded(enc)

    @abstractmethod
    def _encode(self, x: Any) -> Encoded:
        """Encode a non-empty, finite-checked-by-codec, contiguous float tensor; the node decodes to x's shape."""

    @abstractmethod
    def _decode(self, enc: Encoded, parts: dict[str, Any]) -> Any:
        """Rebuild the float tensor of node `enc` from its already decoded parts."""

    @property
    def stateful(self) -> bool:
        """True when this codec keeps state that shapes what it sends next and that a checkpoint carries
        (`export_state`); `delta`'s sample caches are not such state: both ends drop them on recovery."""
        return False

    def export_state(self) -> dict[str, np.ndarray]:
        """The state that shapes what this codec sends next, as host numpy copies under string keys without '/'
        (a nested codec's under `INNER_PREFIX`); empty for a stateless codec."""
        return {}

    def import_state(self, state: Mapping[str, Any], *, shape: tuple[int, ...] | None = None,
                     name: str = "the tensor") -> None:
        """Replace this codec's state with `state` (an `export_state` dict of a codec of the same spec) for
        tensors of `shape`; CodecError names `name` and the mismatch, and then nothing changed."""
        if state:
            raise CodecError(f"codec state of {name}: {self.spec} keeps no state but got {sorted(state)[:3]}; it "
                             "was saved with another codec: resume with the codec it was saved with")

    def __repr__(self) -> str:
        return f"<codec {self.spec}>"


INNER_PREFIX = "inner."  # a nested codec's state keys, under its wrapper's: ef(fp16(lowrank)) -> inner.inner.warm:...


def nest_state(state: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """An inner codec's `export_state` as its wrapper exports it (keys under `INNER_PREFIX`)."""
    return {INNER_PREFIX + k: v for k, v in state.items()}


def split_state(state: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(a wrapper's own keys, its inner codec's state with `INNER_PREFIX` taken off) of an `export_state` dict."""
    own = {k: v for k, v in state.items() if not str(k).startswith(INNER_PREFIX)}
    return own, {str(k)[len(INNER_PREFIX):]: v for k, v in state.items() if str(k).startswith(INNER_PREFIX)}


class ElementCodec(Codec):
    """A codec that maps each element (or block) on its own; with an inner codec it compresses the inner's parts."""

    def __init__(self, inner: Codec | None = None):
        self.inner = inner

    @property
    def leaf_spec(self) -> str:
        """Spec of this codec without its inner codec (the spec of its own nodes)."""
        return self.name

    @property
    def spec(self) -> str:
        if self.inner is None:
            return self.leaf_spec
        node = parse_spec(self.leaf_spec)
        return format_spec(SpecNode(node.name, (parse_spec(self.inner.spec),) + node.args, node.kwargs))

    @property
    def stateful(self) -> bool:
        return self.inner is not None and self.inner.stateful

    def export_state(self) -> dict[str, np.ndarray]:
        return nest_state(self.inner.export_state()) if self.inner is not None else {}

    def import_state(self, state: Mapping[str, Any], *, shape: tuple[int, ...] | None = None,
                     name: str = "the tensor") -> None:
        own, inner = split_state(state)
        if own or self.inner is None:
            super().import_state(state, shape=shape, name=name)  # this codec keeps none of its own: refused
        else:
            self.inner.import_state(inner, shape=shape, name=name)

    def _encode(self, x: Any) -> Encoded:
        if self.inner is None:
            return self._encode_leaf(x)
        return self._wrap(self.inner._encode(x))

    def _wrap(self, enc: Encoded) -> Encoded:
        parts = {}
        for k, v in enc.parts.items():
            if isinstance(v, Encoded):
                parts[k] = self._wrap(v)
            elif B.is_float_dtype(B.dtype_name(v)) and B.numel(v) > 0:
                parts[k] = self._encode_leaf(B.contiguous(v))
            else:
                parts[k] = v
        return replace(enc, parts=parts, _header=None)

    @abstractmethod
    def _encode_leaf(self, x: Any) -> Encoded:
        """Encode one float array as a node of spec `leaf_spec`."""

    usage: ClassVar[str] = ""

    @classmethod
    def from_spec(cls, node: SpecNode) -> "ElementCodec":
        inner, rest = split_inner(node, cls.usage)
        parse_args(rest, (), {}, cls.usage)
        return cls(inner)


def split_inner(node: SpecNode, usage: str) -> tuple[Codec | None, SpecNode]:
    """Separate the (at most one) nested codec argument of an element codec from its numeric arguments."""
    inner = [a for a in node.args if isinstance(a, SpecNode)]
    if len(inner) > 1:
        raise SpecError(f"codec {format_spec(node)!r}: takes at most one inner codec; usage: {usage}")
    rest = SpecNode(node.name, tuple(a for a in node.args if not isinstance(a, SpecNode)), node.kwargs)
    codec = codec_from_node(inner[0]) if inner else None
    if codec is not None and codec.raw_parts:  # it codes the finished tree: nothing may re-encode its parts
        raise SpecError(f"codec {format_spec(node)!r}: {codec.name} must be the outermost codec (inside ef at most), "
                        f"e.g. {codec.name}({node.name}); usage: {usage}")
    return codec, rest


CODECS: Registry[type[Codec]] = Registry("codec", known="codecs", error=SpecError)


def register_codec(cls: type[Codec]) -> type[Codec]:
    """Class decorator adding a codec class to the registry under its `name`."""
    return CODECS.add(cls.name, cls)


def known_codecs() -> list[str]:
    """Names of every registered codec."""
    return CODECS.names()


def codec_from_node(node: SpecNode) -> Codec:
    """Instantiate the codec a parsed spec names."""
    return CODECS.get(node.name).from_spec(node)


def get_codec(spec: str | Codec) -> Codec:
    """A new codec instance for `spec` (e.g. 'fp16(svd(0.6))'); a Codec passes through unchanged."""
    if isinstance(spec, Codec):
        return spec
    return codec_from_node(parse_spec(spec))


@functools.lru_cache(maxsize=256)
def _decoder(spec: str) -> Codec:
    return get_codec(spec)


def decode_encoded(enc: Encoded) -> Any:
    """Decode any Encoded tree without codec state (nodes name their codec)."""
    if not isinstance(enc, Encoded):
        raise CodecError(f"decode expects an Encoded (from Codec.encode), got {type(enc).__name__}")
    codec = _decoder(enc.codec)
    parts = enc.parts if codec.raw_parts else {k: decode_encoded(v) if isinstance(v, Encoded) else v
                                                for k, v in enc.parts.items()}
    y = codec._decode(enc, parts)
    if B.shape_of(y) != enc.shape:
        y = B.reshape(y, enc.shape)
    if B.is_paddle(y) or enc.dtype != "bfloat16":
        return B.cast(y, enc.dtype)
    return B.cast(y, "float32")  # numpy has no bfloat16; float32 holds every bfloat16 value exactly


def _check_input(x: Any, spec: str) -> Any:
    if isinstance(x, np.generic):
        x = np.asarray(x)
    if not isinstance(x, np.ndarray) and not B.is_paddle(x):
        raise CodecError(f"codec {spec!r}: expected a numpy.ndarray or paddle.Tensor, got {type(x).__name__}; "
                         f"convert with numpy.asarray(x) first")
    dt = B.dtype_name(x)
    if dt not in B.WIRE_DTYPES:
        raise CodecError(f"codec {spec!r}: dtype {dt!r} cannot be sent; use one of {', '.join(B.WIRE_DTYPES)}")
    return B.contiguous(x)


def parse_args(node: SpecNode, positional: tuple[str, ...], allowed: dict[str, Callable[[Any], bool]],
               hint: str) -> dict[str, Any]:
    """Map a spec's positional and keyword args to names, checking count, names and value predicates."""
    if len(node.args) > len(positional):
        raise SpecError(f"codec {format_spec(node)!r}: too many arguments; usage: {hint}")
    values = dict(zip(positional, node.args))
    for k, v in node.kwargs:
        if k not in allowed:
            raise SpecError(f"codec {format_spec(node)!r}: unknown argument {k!r}; usage: {hint}")
        if k in values:
            raise SpecError(f"codec {format_spec(node)!r}: argument {k!r} given twice; usage: {hint}")
        values[k] = v
    for k, v in values.items():
        if not allowed[k](v):
            raise SpecError(f"codec {format_spec(node)!r}: invalid value {format_spec(v) if isinstance(v, SpecNode) else v!r}"
                            f" for {k!r}; usage: {hint}")
    return values
