"""How secure aggregation composes with the rest of the federated mode: strategies, update codecs, the hierarchy.

Hierarchy. Each combiner runs SecAgg+ among its own clients and learns only their SecureSum: S_j = Σ w_i·clip(Δ_i)
with w_i = min(n_i, W)/W, and C_j = Σ min(n_i, W), the total of the survivors' public, signed weights (a weight
is not masked: a masked count could be forged to 2^b − 1, silencing every other client and combiner, while the
public C_j ≤ n·W bounds what one combiner weighs at the reducer). The reducer adds sums of sums:
mean Δ = W·Σ_j S_j / Σ_j C_j, which is exactly FedAvg's example-weighted mean of the clients' changes (for
n_i ≤ W and no clipping). Equivalently a combiner may hand the reducer the partial S_j·W/C_j with weight C_j: the
reducer's existing example-weighted mean of partials gives the same model, so it needs no change.

Weighting. A client pre-multiplies its change by its own weight before masking, since the server can no longer
weight what it cannot see. The weight is capped at W (`max_weight`) so one client cannot claim an unbounded
share of the mean, and so the masked sum has a known bound (the fixed-point headroom and the range check, see
`quantize`).

Codecs. The masked words are uniform, so no codec can shrink them, and a lossy codec's decode of a sum is not the
sum of its decodes; on the masked path the fixed-point quantiser replaces the codec. `none` masks 32-bit words
(4 bytes per parameter, as raw float32); `fp16` and `bf16` become 16-bit words (2 bytes, as the codec), allowed
only when the headroom leaves at least the codec's precision (2^10 or 2^7 levels up to the clip range); every
other codec is refused.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from nebula.federated.secagg.messages import SecureSum
from nebula.federated.secagg.quantize import Quantizer

__all__ = ["PROTOCOLS", "check_strategy", "word_bits_for_codec", "check_codec_precision", "flatten", "unflatten",
           "reduce_sums", "partial_mean"]

PROTOCOLS = ("none", "secagg+")
CODEC_LEVELS_BITS = {"none": 0, "fp16": 10, "bf16": 7}  # fixed-point levels up to clip_range matching the codec


def check_strategy(strategy: object) -> None:
    """ValueError unless `strategy` (a nebula.federated Strategy) aggregates a plain sum, as secagg+ requires."""
    from nebula.federated.strategy import Strategy

    name = getattr(strategy, "name", type(strategy).__name__)
    if not getattr(strategy, "synchronous", True):
        raise ValueError(f"strategy {name!r} applies each client's update on its own, but secure_aggregation: "
                         "secagg+ shows the server only sums; use fedavg, fedprox, fedadam, fedyogi or fedadagrad")
    if type(strategy).combine is not Strategy.combine:
        raise ValueError(f"strategy {name!r} needs every client's update (a robust combine), but secure_aggregation:"
                         " secagg+ shows the combiner only their sum; use fedavg, fedprox, fedadam, fedyogi or "
                         "fedadagrad, or drop secure_aggregation")


def word_bits_for_codec(update_codec: str) -> int:
    """The masked word width standing in for `update_codec`; ValueError for a codec that does not compose."""
    spec = update_codec.strip()
    if spec == "none":
        return 32
    if spec in ("fp16", "bf16"):
        return 16
    raise ValueError(f"update_codec {update_codec!r} does not compose with secure_aggregation: secagg+ (masked words "
                     "are uniform and a lossy codec's decoded sum is not the sum); use update_codec: none (32-bit "
                     "fixed point) or fp16/bf16 (16-bit)")


def check_codec_precision(update_codec: str, quantizer: Quantizer) -> None:
    """ValueError when `quantizer`'s fixed point is coarser than the precision `update_codec` promised."""
    need = CODEC_LEVELS_BITS.get(update_codec.strip(), 0)
    if quantizer.clip_range * quantizer.scale < (1 << need):
        raise ValueError(f"update_codec {update_codec!r} with {quantizer.max_clients} clients per combiner leaves "
                         f"{quantizer.clip_range * quantizer.scale:g} fixed-point levels up to clip_range, fewer than "
                         f"the codec's 2^{need}; use update_codec: none (32-bit words) or fewer clients per combiner")


def flatten(weights: Mapping[str, np.ndarray], names: Sequence[str]) -> np.ndarray:
    """One float64 vector of the tensors `names`, in that order (the order every party of the round uses)."""
    return np.concatenate([np.asarray(weights[k], np.float64).ravel() for k in names])


def unflatten(vector: np.ndarray, like: Mapping[str, np.ndarray], names: Sequence[str]) -> dict[str, np.ndarray]:
    """Tensors shaped and typed as `like`, cut from `vector` in the order `names`."""
    out, at = {}, 0
    for k in names:
        ref = like[k]
        out[k] = vector[at:at + ref.size].reshape(ref.shape).astype(ref.dtype)
        at += ref.size
    if at != vector.size:
        raise ValueError(f"vector of {vector.size} values for tensors of {at}; flatten and unflatten the same model")
    return out


def reduce_sums(sums: Sequence[SecureSum]) -> tuple[np.ndarray, int, float]:
    """The reducer: (mean change W·ΣS_j/ΣC_j, total count ΣC_j, bound on each coordinate's rounding error)."""
    if not sums:
        raise ValueError("no secure sums to reduce; wait for at least one combiner")
    w, size = sums[0].max_weight, sums[0].vector.size
    for s in sums:
        if s.max_weight != w or s.vector.size != size:
            raise ValueError(f"secure sum of round {s.round} has max_weight {s.max_weight} and {s.vector.size} values, "
                             f"another has {w} and {size}; every combiner must use the job's settings")
    total = np.zeros(size, np.float64)
    for s in sums:
        total += s.vector
    count = sum(s.num_examples for s in sums)
    if count <= 0:
        raise ValueError("secure sums carry no examples; nothing to average")
    return total * (w / count), count, sum(s.error_bound for s in sums) * w / count


def partial_mean(s: SecureSum) -> tuple[np.ndarray, int]:
    """A combiner's SecureSum as (partial mean change, example count) for the reducer's weighted mean."""
    if s.num_examples <= 0:
        raise ValueError(f"secure sum of round {s.round} carries no examples")
    return s.vector * (s.max_weight / s.num_examples), s.num_examples
