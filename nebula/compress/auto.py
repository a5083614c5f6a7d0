"""Bandwidth-adaptive codec `auto(budget, ...)`: picks the candidate minimising encode + transfer + decode time within an error budget."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from . import backend as B
from .base import (Codec, CodecError, Encoded, check_finite, decode_encoded, get_codec, parse_args, register_codec,
                   relative_error)
from .device import relative_error_on_device
from .spec import SpecError, SpecNode, format_spec, parse_spec

__all__ = ["AutoCodec", "Measurement", "default_candidates", "pick_measurement"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Measurement:
    """One candidate measured on a real tensor."""

    spec: str
    encode_s: float
    decode_s: float
    nbytes: int
    error: float

    def total_s(self, bytes_per_s: float) -> float:
        """Estimated encode + transfer + decode time on a link of this bandwidth."""
        return self.encode_s + self.nbytes / bytes_per_s + self.decode_s


def default_candidates(budget: float) -> list[str]:
    """Candidate specs for an error budget: casts, integer quantizers and low-rank factors sized to the budget."""
    energy = max(1e-3, min(0.999999, 1.0 - (0.8 * budget) ** 2))
    return ["none", "bf16", "fp16", "int8_row", "int8_block(64)", "int4_block(64)",
            f"fp16(lowrank(energy={energy:.6g}))", f"int8_row(lowrank(energy={energy:.6g}))"]


def pick_measurement(measurements: list[Measurement], budget: float, bytes_per_s: float) -> Measurement:
    """The measurement within the error budget with the least total time (ties: fewer bytes).

    A candidate that sends more than `none` (the raw tensor) is never picked while a smaller one meets the budget.
    """
    ok = [m for m in measurements if m.error <= budget] or [m for m in measurements if m.error == 0.0]
    if not ok:
        raise CodecError(f"auto: no candidate meets error budget {budget} and none is lossless; add 'none'")
    raw = next((m.nbytes for m in measurements if m.spec == "none"), None)
    if raw is not None:
        ok = [m for m in ok if m.nbytes <= raw] or ok
    return min(ok, key=lambda m: (m.total_s(bytes_per_s), m.nbytes))


@register_codec
class AutoCodec(Codec):
    """Measures each candidate on the first tensor of a shape (and every `every` tensors), then sends with the
    fastest one whose relative L2 error is within the budget at the current link bandwidth."""

    name = "auto"
    usage = ("auto(budget) or auto(budget, cand1, cand2, ..., mbit=100, every=500): budget in (0, 1] is the relative "
             "L2 error allowed, mbit the initial link bandwidth in Mbit/s (update with update_bandwidth), every the "
             "number of tensors between re-measurements")

    def __init__(self, budget: float, candidates: list[str] | None = None, mbit: float = 100.0, every: int = 500):
        self.budget, self.every = budget, every
        self._explicit = candidates is not None
        self.candidates = {s: get_codec(s) for s in (candidates or default_candidates(budget))}
        if "none" not in self.candidates:
            self.candidates["none"] = get_codec("none")
        self.bytes_per_s = mbit * 1e6 / 8
        self._mbit = mbit
        self._measured: dict[tuple, list[Measurement]] = {}
        self._choice: dict[tuple, str] = {}
        self._count: dict[tuple, int] = {}
        self.decisions: list[tuple[float, str]] = []  # (bytes_per_s, chosen spec), appended whenever it changes
        self._warned: set[tuple] = set()  # (tensor key, candidate) already reported as larger than the raw tensor

    @property
    def spec(self) -> str:
        items = [repr(self.budget)]
        if self._explicit:
            items += list(self.candidates)
        items += [f"mbit={self._mbit!r}"] + ([f"every={self.every}"] if self.every != 500 else [])
        return f"auto({', '.join(items)})"

    @classmethod
    def from_spec(cls, node: SpecNode) -> "AutoCodec":
        nums = tuple(a for a in node.args if not isinstance(a, SpecNode))
        cands = [format_spec(a) for a in node.args if isinstance(a, SpecNode)]
        is_budget = lambda v: isinstance(v, (int, float)) and 0 < v <= 1  # noqa: E731
        args = parse_args(SpecNode(node.name, nums, node.kwargs), ("budget",), {
            "budget": is_budget, "mbit": lambda v: isinstance(v, (int, float)) and v > 0,
            "every": lambda v: isinstance(v, int) and v >= 1}, cls.usage)
        if "budget" not in args:
            raise SpecError(f"codec 'auto' needs an error budget; usage: {cls.usage}")
        for c in cands:
            if parse_spec(c).name in ("auto", "ef"):
                raise SpecError(f"auto: candidate {c!r} cannot be another auto or ef codec; usage: {cls.usage}")
        return cls(args["budget"], cands or None, args.get("mbit", 100.0), args.get("every", 500))

    def update_bandwidth(self, bytes_per_s: float) -> None:
        """Tell the codec the measured link bandwidth; the choice is re-decided for every tensor shape seen."""
        if not bytes_per_s > 0:
            raise ValueError(f"bandwidth must be > 0 bytes/s, got {bytes_per_s!r}")
        self.bytes_per_s = float(bytes_per_s)
        for key, ms in self._measured.items():
            self._decide(key, ms)

    def chosen(self, shape: tuple[int, ...] | None = None) -> str | None:
        """Spec currently chosen for tensors of `shape` (default: the last shape encoded)."""
        if not self._choice:
            return None
        if shape is None:
            return self.decisions[-1][1] if self.decisions else next(iter(self._choice.values()))
        return next((v for k, v in self._choice.items() if k[0] == tuple(shape)), None)

    def measurements(self, shape: tuple[int, ...]) -> list[Measurement]:
        """Latest measurements for tensors of `shape`."""
        return next((v for k, v in self._measured.items() if k[0] == tuple(shape)), [])

    def _decide(self, key: tuple, ms: list[Measurement]) -> str:
        raw = next((m.nbytes for m in ms if m.spec == "none"), None)
        big = [m.spec for m in ms if raw is not None and m.nbytes > raw and (key, m.spec) not in self._warned]
        if big:
            self._warned.update((key, s) for s in big)
            log.warning("auto(%s): %s send more than the raw tensor (%d bytes) at shape %s; not chosen there",
                        self.budget, ", ".join(big), raw, list(key[0]))
        best = pick_measurement(ms, self.budget, self.bytes_per_s).spec
        if self._choice.get(key) != best:
            log.info("auto(%s): %s at %.3g Mbit/s for shape %s", self.budget, best, self.bytes_per_s * 8e-6, key[0])
            self.decisions.append((self.bytes_per_s, best))
        self._choice[key] = best
        return best

    def _measure(self, x: Any) -> tuple[list[Measurement], dict[str, Encoded]]:
        ms, encs = [], {}
        for spec, codec in self.candidates.items():
            t0 = time.perf_counter()
            try:
                enc = codec._encode(x) if codec.lossy else codec.encode(x)
            except CodecError as exc:
                log.info("auto: candidate %s cannot encode this tensor: %s", spec, exc)
                continue
            t1 = time.perf_counter()
            y = decode_encoded(enc)
            t2 = time.perf_counter()
            err = relative_error_on_device(x, y) if B.is_paddle(x) else relative_error(x, y)
            ms.append(Measurement(spec, t1 - t0, t2 - t1, enc.nbytes, err))
            encs[spec] = enc
        return ms, encs

    def _encode(self, x: Any) -> Encoded:
        check_finite(x, self.spec)  # whatever is chosen, NaN/Inf is reported the same way
        key = (B.shape_of(x), B.dtype_name(x), B.kind_of(x))
        n = self._count.get(key, 0)
        self._count[key] = n + 1
        if key not in self._measured or n % self.every == 0:
            ms, encs = self._measure(x)
            self._measured[key] = ms
            return encs[self._decide(key, ms)]
        codec = self.candidates[self._choice[key]]
        return codec._encode(x) if codec.lossy else codec.encode(x)

    def _decode(self, enc: Encoded, parts: dict[str, Any]) -> Any:
        raise CodecError("auto(...) nodes never go on the wire; decode the chosen codec's encoding instead")
