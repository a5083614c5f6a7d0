"""Scenario I sizing: how many receivers k one sender should feed, from the measured speeds of both sides."""
from __future__ import annotations

import math

__all__ = ["choose_k"]


def choose_k(sender_s: float, receiver_s: float, *, max_k: int | None = None) -> int:
    """k that keeps both sides busy: a sender run produces k results in k*sender_s while each receiver takes
    receiver_s for one, so k = receiver_s / sender_s rounded to the k with the smaller idle fraction.

    `sender_s` / `receiver_s`: measured seconds per micro-batch of the sender and receiver stage.
    """
    if not (sender_s > 0 and receiver_s > 0) or not (math.isfinite(sender_s) and math.isfinite(receiver_s)):
        raise ValueError(f"choose_k: times must be finite and > 0, got sender_s={sender_s}, receiver_s={receiver_s}")
    if max_k is not None and max_k < 1:
        raise ValueError(f"choose_k: max_k={max_k} must be >= 1")
    ratio = receiver_s / sender_s
    lo, hi = max(1, math.floor(ratio)), max(1, math.ceil(ratio))

    def idle(k: int) -> float:  # fraction of the slower side's period that the other side idles
        period = max(k * sender_s, receiver_s)
        return (period - k * sender_s) / period + (period - receiver_s) / period

    k = min((lo, hi), key=lambda c: (idle(c), c))
    return min(k, max_k) if max_k is not None else k
