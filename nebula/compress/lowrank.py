"""Low-rank codecs: the paper's `svd(r)` (full SVD, keep a fraction of singular values) and `lowrank` (randomized, warm-started)."""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from . import backend as B
from . import factorize as F
from .base import Codec, CodecError, Encoded, check_finite, parse_args, register_codec
from .spec import SpecError, SpecNode

__all__ = ["SVDCodec", "LowRankCodec"]


def _is_ratio(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 1


def _is_count(lo: int, hi: int):
    return lambda v: isinstance(v, int) and lo <= v <= hi


def _finite(a: Any) -> bool:
    if B.is_paddle(a):
        import paddle

        return bool(paddle.isfinite(a).all())
    return bool(np.isfinite(a).all())


def _matrix(x: Any, spec: str) -> Any:
    check_finite(x, spec)
    return B.reshape(x, F.matrix_shape(B.shape_of(x)))


def _check_factors(enc: Encoded, p: Any, q: Any) -> None:
    m, n = F.matrix_shape(enc.shape)
    ps, qs = B.shape_of(p), B.shape_of(q)
    if len(ps) != 2 or len(qs) != 2 or ps[0] != m or qs[1] != n or ps[1] != qs[0]:
        raise CodecError(f"codec {enc.codec!r}: factor shapes {ps} and {qs} do not rebuild shape {enc.shape}; "
                         "the frames are corrupted or from another version")


def _warm_tag(n: int, dtype: str, kind: str) -> str:
    return f"{kind}:{dtype}:{int(n)}"


def _parse_tag(tag: str, what: str) -> tuple[int, str, str]:
    kind, dtype, n = (tag.split(":") + ["", "", ""])[:3]
    if tag.count(":") != 2 or kind not in ("numpy", "paddle") or not B.is_float_dtype(dtype) or not n.isdigit():
        raise CodecError(f"{what}: key {tag!r} is not <numpy|paddle>:<float dtype>:<columns>; it was written by "
                         "another version: resume with that version or from an earlier checkpoint")
    return int(n), dtype, kind


_MASK = (1 << 64) - 1


def _rng_words(rng: np.random.Generator) -> np.ndarray:
    """The PCG64 generator's position as 6 uint64 words (state, increment, cached half-word)."""
    st = rng.bit_generator.state
    s, inc = int(st["state"]["state"]), int(st["state"]["inc"])
    return np.array([s >> 64, s & _MASK, inc >> 64, inc & _MASK, int(st["has_uint32"]), int(st["uinteger"])],
                    np.uint64)


def _rng_from_words(words: Any, what: str) -> np.random.Generator:
    w = np.asarray(words)
    if w.shape != (6,) or w.dtype != np.uint64 or int(w[4]) > 1:
        raise CodecError(f"{what}: its generator position is a {w.dtype.name} array of shape {w.shape}, not 6 uint64 "
                         "words; the state is corrupted")
    v = [int(x) for x in w]
    rng = np.random.default_rng()
    rng.bit_generator.state = {"bit_generator": "PCG64", "state": {"state": (v[0] << 64) | v[1],
                                                                   "inc": (v[2] << 64) | v[3]},
                               "has_uint32": v[4], "uinteger": v[5]}
    return rng


@register_codec
class SVDCodec(Codec):
    """The paper's SVD(r): full SVD of the [B*T, H] matrix, keep round(r*min(m,n)) singular values, send U, S, V^T."""

    name = "svd"
    usage = "svd(r) with r in (0, 1], the fraction of singular values kept, e.g. svd(0.6)"

    def __init__(self, ratio: float):
        self.ratio = ratio

    @property
    def spec(self) -> str:
        return f"svd({self.ratio!r})"

    @classmethod
    def from_spec(cls, node: SpecNode) -> "SVDCodec":
        args = parse_args(node, ("r",), {"r": _is_ratio}, cls.usage)
        if "r" not in args:
            raise SpecError(f"codec 'svd' needs the fraction of singular values to keep; usage: {cls.usage}")
        return cls(args["r"])

    def _encode(self, x: Any) -> Encoded:
        a = _matrix(x, self.spec)
        m, n = B.shape_of(a)
        u, s, vt = F.truncated_svd(a, F.keep_count(self.ratio, m, n))
        return Encoded(self.spec, B.dtype_name(x), B.shape_of(x), {"u": u, "s": s, "vt": vt}, kind=B.kind_of(x))

    def _decode(self, enc: Encoded, parts: dict[str, Any]) -> Any:
        u, s, vt = parts["u"], parts["s"], parts["vt"]
        _check_factors(enc, u, vt)
        return F.reconstruct(u * B.reshape(s, (1, B.numel(s))), vt)


@register_codec
class LowRankCodec(Codec):
    """Rank-k factors P [m,k] = U S, Q [k,n] = V^T by randomized range finding; warm-started across calls."""

    name = "lowrank"
    usage = ("lowrank(rank=K) | lowrank(ratio=R) | lowrank(energy=E), optional power=0 (iterations per call when "
             "warm-started; one more on a cold start), oversample=8, warm=1, seed=0; K >= 1, R and E in (0, 1]")

    def __init__(self, *, rank: int | None = None, ratio: float | None = None, energy: float | None = None,
                 power: int = 0, oversample: int = 8, warm: int = 1, seed: int = 0):
        self.rank, self.ratio, self.energy = rank, ratio, energy
        self.power, self.oversample, self.warm, self.seed = power, oversample, warm, seed
        self._rng = np.random.default_rng(seed)
        self._state: dict[tuple, tuple[Any, int]] = {}  # per matrix signature: (start block, last rank)

    @property
    def spec(self) -> str:
        target = (f"rank={self.rank}" if self.rank is not None else
                  f"ratio={self.ratio!r}" if self.ratio is not None else f"energy={self.energy!r}")
        extra = [f"{k}={v}" for k, v, d in (("power", self.power, 0), ("oversample", self.oversample, 8),
                                            ("warm", self.warm, 1), ("seed", self.seed, 0)) if v != d]
        return f"lowrank({', '.join([target, *extra])})"

    @classmethod
    def from_spec(cls, node: SpecNode) -> "LowRankCodec":
        args = parse_args(node, ("rank",), {
            "rank": _is_count(1, 1 << 30), "ratio": _is_ratio, "energy": _is_ratio, "power": _is_count(0, 16),
            "oversample": _is_count(0, 1 << 16), "warm": _is_count(0, 1), "seed": _is_count(0, 2**63 - 1)}, cls.usage)
        if sum(k in args for k in ("rank", "ratio", "energy")) != 1:
            raise SpecError(f"codec 'lowrank' needs exactly one of rank=, ratio=, energy=; usage: {cls.usage}")
        return cls(**args)

    def reset(self) -> None:
        """Forget the warm-start state (e.g. after the tensor's statistics changed abruptly)."""
        self._state.clear()

    @property
    def stateful(self) -> bool:
        return True  # warm starts, and the random draws of every sketch wider than its warm start

    def export_state(self) -> dict[str, np.ndarray]:
        """Host copies of each warm start (`warm:<kind>:<dtype>:<columns>`, the [n, width] start block, and
        `rank:...`, the last rank kept) and the generator's position (`rng`, 6 uint64 words)."""
        out: dict[str, np.ndarray] = {"rng": _rng_words(self._rng)}
        for (n, dtype, kind, _place), (block, rank) in self._state.items():
            tag = _warm_tag(n, dtype, kind)
            if f"warm:{tag}" in out:  # the same matrices on two devices: one start block per key
                raise CodecError(f"codec {self.spec!r}: warm starts for {n} columns on two devices cannot be saved; "
                                 "encode each tensor on one device")
            out[f"warm:{tag}"] = np.array(B.to_host(block), copy=True)
            out[f"rank:{tag}"] = np.array(rank, np.int64)
        return out

    def import_state(self, state: Mapping[str, Any], *, shape: tuple[int, ...] | None = None,
                     name: str = "the tensor") -> None:
        """Replace the warm starts and the generator's position with those of `state` (an `export_state` dict;
        without `rng` the generator restarts from `seed`), checked first: CodecError names `name` and the
        mismatch, and then nothing changed."""
        what = f"low-rank warm start of {name}"
        rng = np.random.default_rng(self.seed)
        blocks: dict[str, tuple[np.ndarray, int]] = {}
        for key, value in state.items():
            kind_, _, tag = str(key).partition(":")
            if key == "rng":
                rng = _rng_from_words(value, what)
            elif kind_ in ("warm", "rank") and tag:
                blocks.setdefault(tag, [None, None])[kind_ == "rank"] = value  # type: ignore[index]
            else:
                raise CodecError(f"{what}: key {key!r} is not rng, warm:... or rank:...; it was written by another "
                                 "version: resume with that version or from an earlier checkpoint")
        new: dict[tuple, tuple[Any, int]] = {}
        for tag, (block, rank) in blocks.items():
            n, dtype, kind = _parse_tag(tag, what)
            if block is None or rank is None:
                raise CodecError(f"{what}: {tag!r} has a start block or a rank but not both; the state is corrupted")
            a, r = np.asarray(block), np.asarray(rank)
            if a.ndim != 2 or a.shape[0] != n or a.shape[1] < 1 or a.dtype.name != dtype or not np.isfinite(a).all():
                raise CodecError(f"{what}: start block {tag!r} is a {a.dtype.name} array of shape {a.shape}, not a "
                                 f"finite {dtype} [{n}, width]; the state is corrupted")
            if r.shape != () or r.dtype.kind not in "iu" or int(r) < 1:
                raise CodecError(f"{what}: rank {tag!r} is {r!r}, not one integer >= 1; the state is corrupted")
            if shape is not None and F.matrix_shape(tuple(shape))[1] != n:
                raise CodecError(f"{what}: saved for matrices of {n} columns but the tensor has shape {tuple(shape)}; "
                                 "it was saved for another model or other settings")
            host = np.array(a, copy=True)
            dev = B.from_host(host, dtype, kind)
            new[(n, dtype, kind, str(getattr(dev, "place", "")))] = (dev, int(r))
        self._state, self._rng = new, rng

    def _sketch(self, a: Any, key: tuple, width: int) -> tuple[Any, Any, Any]:
        """Randomized SVD of width `width`, from the warm start block when there is one (then one iteration less).

        Warm-started with power=0 this is one subspace iteration per call, carried across calls (as in PowerSGD).
        """
        warm = self.warm and key in self._state
        return F.randomized_svd(a, width, self.power + (0 if warm else 1), self._start_block(a, key, width))

    def _start_block(self, a: Any, key: tuple, width: int) -> Any:
        n = B.shape_of(a)[1]
        prev = self._state.get(key)[0] if (self.warm and key in self._state) else None
        have = 0 if prev is None else min(width, B.shape_of(prev)[1])
        if have == width:
            return prev[:, :width]
        g = self._rng.standard_normal((n, width - have)).astype(B.dtype_name(a))
        g = B.from_host(g, B.dtype_name(a), B.kind_of(a), getattr(a, "place", None))
        if prev is None:
            return g
        if B.is_paddle(a):
            import paddle

            return paddle.concat([prev[:, :have], g], axis=1)
        return np.concatenate([prev[:, :have], g], axis=1)

    def _factor(self, a: Any, key: tuple) -> tuple[Any, Any, Any, int]:
        m, n = B.shape_of(a)
        full = min(m, n)
        if self.energy is not None:
            total = F.squared_norm(a)
            prev = self._state.get(key)
            k0 = prev[1] if (prev is not None and self.warm) else min(full, 16)
            width = min(full, k0 + self.oversample)
            while True:
                if 2 * width >= full:
                    u, s, vt = F.truncated_svd(a, full)
                    width = full
                else:
                    u, s, vt = self._sketch(a, key, width)
                k = F.energy_rank(s, total, self.energy) if total > 0 else 1
                if k is not None or width == full:
                    return u, s, vt, max(1, min(k or width, width))
                width = min(full, 2 * width)
        k = self.rank if self.rank is not None else F.keep_count(self.ratio, m, n)
        k = min(k, full)
        width = min(full, k + self.oversample)
        if 2 * width >= full:  # a sketch this wide costs as much as the exact SVD
            u, s, vt = F.truncated_svd(a, k)
            return u, s, vt, k
        u, s, vt = self._sketch(a, key, width)
        return u, s, vt, k

    def _encode(self, x: Any) -> Encoded:
        a = B.reshape(x, F.matrix_shape(B.shape_of(x)))  # NaN/Inf show up in s: no extra pass over x here
        key = (B.shape_of(a)[1], B.dtype_name(a), B.kind_of(a), str(getattr(a, "place", "")))
        try:
            u, s, vt, k = self._factor(a, key)
        except (np.linalg.LinAlgError, ValueError, RuntimeError):
            check_finite(x, self.spec)
            raise
        if not _finite(s):
            check_finite(x, self.spec)
            raise CodecError(f"codec {self.spec!r}: the factorisation overflowed; scale the tensor or use 'bf16'")
        if self.warm:
            self._state[key] = (B.contiguous(vt.T if not B.is_paddle(vt) else vt.transpose([1, 0])), k)
        p = B.contiguous(u[:, :k] * B.reshape(s[:k], (1, k)))
        return Encoded(f"lowrank(rank={k})", B.dtype_name(x), B.shape_of(x), {"p": p, "q": B.contiguous(vt[:k])},
                       kind=B.kind_of(x))

    def _decode(self, enc: Encoded, parts: dict[str, Any]) -> Any:
        _check_factors(enc, parts["p"], parts["q"])
        return F.reconstruct(parts["p"], parts["q"])
