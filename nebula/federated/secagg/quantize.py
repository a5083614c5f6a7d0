"""Fixed-point quantisation of float updates into words modulo 2^b (b = 32, or 16 for the fp16/bf16 codecs).

Why integers mod 2^b, not a prime field: masks cancel under any group, and numpy's unsigned words wrap mod 2^b for
free (no reduction pass, one add per word), while a b-bit word costs the same bytes as the float it replaces.

The map, for a client of public weight w_i = min(n_i, W) (n_i its num_examples, W = `max_weight`):
  v = (w_i/W) · clip(x, −c, c)               (c = `clip_range`; so |v| ≤ c; the weight capped, so it is bounded)
  q = round(v · s) mod 2^b                   (round to nearest; s = `scale`, a power of two)
(`encode_vector`). The weight travels beside the masked words, in the clear and signed (a client's data size is
public to its combiner: a masked count could be forged to 2^b − 1, silencing everyone else).
The sum of N ≤ `max_clients` clients' words is decoded as a signed b-bit integer and divided by s
(`decode_sum(words, Σ w_i)`).

Headroom: |q| ≤ c·s + 1/2, so the true integer sum stays in the signed range when N·(c·s + 1/2) ≤ 2^(b−1) − 1;
`scale` is the largest power of two meeting it, s = 2^⌊log2((2^(b−1) − 1 − N/2) / (N·c))⌋. A power of two makes
v·s and the decode division exact in float64, so the only error is rounding: per coordinate |decoded sum − Σ v_i|
≤ n/(2s) for n summed clients (`error_bound`); since s > (2^(b−1) − 1 − N/2)/(2·N·c), that is below about
N²·c/2^(b−1). With b = 32, c = 1 and N = 100: s = 2^24 and the bound is 3.0e−6 on the sum (3.0e−8 on the mean of
100 equal-weight clients).

Bounded inputs: a weight above W is refused (`check_weight`), and the unmasked sum is range-checked
(`check_sum_range`): client i's words satisfy |q_i| ≤ B_i = rint(c·(w_i/W)·s) (the encoder's own float operations,
so the bound is exact), hence any honest sum lies in ±Σ B_i, which the headroom keeps clear of wrap-around. A
coordinate outside it proves some client sent out-of-range words, and the round is refused. What the check cannot
stop: one client's words are arbitrary, so it can still place a coordinate anywhere in ±Σ B_i (`max_influence`):
with n equal weights, n times the largest change an honest client can make. Bounding that needs range proofs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

__all__ = ["Quantizer", "WORD_BITS"]

WORD_BITS = (16, 32)
MIN_LEVELS_BITS = 4  # refuse a scale that leaves fewer than 2^4 levels between 0 and the clip range


@dataclass(frozen=True, slots=True)
class Quantizer:
    """Fixed point for `max_clients` summed updates clipped to ±`clip_range`, weights capped at `max_weight`."""

    clip_range: float
    max_clients: int
    max_weight: int = 1
    word_bits: int = 32

    def __post_init__(self) -> None:
        if self.word_bits not in WORD_BITS:
            raise ValueError(f"secure_aggregation.word_bits={self.word_bits} must be one of {WORD_BITS}")
        if not (math.isfinite(self.clip_range) and self.clip_range > 0):
            raise ValueError(f"secure_aggregation.clip_range={self.clip_range} must be a positive number (the "
                             "largest |change| of one parameter a client sends; larger values are clipped)")
        if self.max_clients < 1:
            raise ValueError(f"secure_aggregation max_clients={self.max_clients} must be >= 1")
        if self.max_weight < 1:
            raise ValueError(f"secure_aggregation.max_weight={self.max_weight} must be >= 1 (the cap on a "
                             "client's num_examples; 1 averages clients unweighted)")
        if self.clip_range * self.scale < (1 << MIN_LEVELS_BITS):
            raise ValueError(f"secure_aggregation: {self.max_clients} clients leave {self.word_bits}-bit words "
                             f"a scale of {self.scale:g} per unit, fewer than {1 << MIN_LEVELS_BITS} levels up to "
                             f"clip_range {self.clip_range}; use 32-bit words (update_codec: none) or fewer clients "
                             "per combiner")

    @property
    def dtype(self) -> np.dtype:
        """The unsigned word type (wraps mod 2^word_bits)."""
        return np.dtype(np.uint32 if self.word_bits == 32 else np.uint16)

    @property
    def scale(self) -> float:
        """s: the largest power of two with max_clients·(clip_range·s + 1/2) ≤ 2^(b−1) − 1."""
        room = (1 << (self.word_bits - 1)) - 1 - self.max_clients / 2
        if room <= 0:
            return 0.0
        return 2.0 ** math.floor(math.log2(room / (self.max_clients * self.clip_range)))

    def error_bound(self, num_clients: int) -> float:
        """Largest |decoded sum − Σ w_i·clip(x_i)| of one coordinate over `num_clients` summed clients."""
        return num_clients / (2.0 * self.scale)

    def weight(self, num_examples: int) -> int:
        """The public weight of a client of `num_examples`: capped at max_weight."""
        return min(int(num_examples), self.max_weight)

    def decode_sum(self, sum_words: np.ndarray, total_weight: int) -> np.ndarray:
        """Σ (w_i/W)·clip(x_i) as float64 from the unmasked sum of at most max_clients clients' `encode_vector`
        words, `total_weight` = Σ w_i of their public weights (call `check_sum_range` first)."""
        if isinstance(total_weight, bool) or not isinstance(total_weight, (int, np.integer)) \
                or not 1 <= total_weight <= self.max_clients * self.max_weight:
            raise ValueError(f"secure sum total_weight={total_weight!r} must be an integer in [1, "
                             f"{self.max_clients * self.max_weight}] (max_clients x max_weight)")
        signed = np.dtype(np.int32 if self.word_bits == 32 else np.int16)
        return self._words(sum_words).view(signed).astype(np.float64) / self.scale

    # -- bounded inputs: public weights, no count word, a range-checked sum ---------------------------------------
    def check_weight(self, weight: int) -> int:
        """`weight` as an int if it is a public weight a client may claim (1..max_weight), else ValueError."""
        if isinstance(weight, bool) or not isinstance(weight, (int, np.integer)) \
                or not 1 <= weight <= self.max_weight:
            raise ValueError(f"a secure aggregation weight is min(num_examples, max_weight), an integer in "
                             f"[1, {self.max_weight}]; got {weight!r}")
        return int(weight)

    def _words(self, sum_words: np.ndarray) -> np.ndarray:
        w = np.asarray(sum_words)
        if w.dtype != self.dtype or w.ndim != 1:
            raise ValueError(f"secure sum words must be a 1-D array of {self.dtype}, got {w.ndim}-D {w.dtype}")
        return w

    def encode_vector(self, vector: np.ndarray, weight: int) -> np.ndarray:
        """Words (one per value) of (weight/W)·clip(vector); `weight` is the client's public min(num_examples, W),
        `vector` 1-D and finite."""
        w = self.check_weight(weight)
        v = np.clip(np.asarray(vector, np.float64), -self.clip_range, self.clip_range)
        v *= w / self.max_weight
        q = np.rint(v * self.scale).astype(np.int64)
        np.remainder(q, 1 << self.word_bits, out=q)
        return q.astype(self.dtype)

    def word_bound(self, weight: int) -> int:
        """B_i: the largest |signed word| `encode_vector` gives a client of public weight `weight`."""
        # the encoder's own float operations on x = c: rounding is monotone, so no |x| <= c gives more
        w = self.check_weight(weight)
        return int(np.rint(np.float64(self.clip_range) * (w / self.max_weight) * self.scale))

    def sum_bound(self, weights: Sequence[int]) -> int:
        """Σ B_i over the survivors' public weights: the largest |signed coordinate| of an honest sum."""
        if not 1 <= len(weights) <= self.max_clients:
            raise ValueError(f"a secure sum has 1..{self.max_clients} survivors' weights, got {len(weights)}")
        return sum(self.word_bound(w) for w in weights)

    def check_sum_range(self, sum_words: np.ndarray, weights: Sequence[int]) -> None:
        """ValueError unless every coordinate of the unmasked sum lies within what clients of public `weights`
        (the survivors') can sum to with inputs clipped to ±clip_range: then some client sent out-of-range words."""
        words = self._words(sum_words)
        bound = self.sum_bound(weights)
        signed = np.dtype(np.int32 if self.word_bits == 32 else np.int16)
        out = int(np.count_nonzero(np.abs(words.view(signed).astype(np.int64)) > bound))
        if out:
            raise ValueError(f"secure sum: {out} of {words.size} coordinates lie outside +-{bound / self.scale:g}, "
                             f"the most {len(weights)} clients' inputs clipped to clip_range {self.clip_range} can "
                             "sum to: a client sent out-of-range words; refuse the round")

    def max_influence(self, weights: Sequence[int]) -> float:
        """The largest change of one coordinate of the decoded mean (W/Σw_i)·Σ(w_i/W)·clip(x_i) that one client
        can cause while `check_sum_range` passes: its words are arbitrary, so with the others fixed it can place the
        sum anywhere in ±Σ B_i, i.e. move the mean across 2·Σ B_i/s·W/Σw_i (2·clip_range for any weights, up to
        rounding). An honest client of weight w can move it by 2·B(w)/s·W/Σw_i at most."""
        return 2 * self.sum_bound(weights) / self.scale * self.max_weight / sum(weights)
