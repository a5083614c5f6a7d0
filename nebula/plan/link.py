"""A WAN link and the wall time a run's traffic takes over it (small pure functions).

A run's `Traffic` (nebula.quality.rows) counts its exchanges E; per exchange the bytes B on its critical path
(crossing one after another), the bytes L the busier direction of the link carries (B when not given), and the
one-way latencies λ it waits. Over a link of rate R (Mbit/s), round trip RTT, a fixed cost O per exchange (the
relays: two switch servers, TLS, framing; 0 unless measured) and a shaper that lets a burst Z through at once
(0 for a real link; the switches' shaper lets max(0.05 s x R, 64 KiB) through), one exchange takes

    exchange_s = max(0, B - Z) * 8 / (R * 1e6)   (serialisation of the critical path's bytes)
               + λ * RTT / 2 + O                (propagation and the relays)

and a run whose critical-path compute is C (seconds, the clusters in parallel) takes

    blocking exchanges (overlapped=False):  max(C + E * exchange_s,  E * L * 8 / (R * 1e6))
    exchanges behind compute (overlapped):  max(C,  E * (L * 8 / (R * 1e6) + λ * RTT / 2 + O))

(the second term of each: the link cannot carry more than its rate, however the schedule hides it). What each mode
records (the engine's `Traffic`, per run):

- all-reduce: one exchange per step, B = L = one cluster's gradient frame, λ = 1 (both clusters send at once, full
  duplex, and wait for the other's).
- diloco: one exchange per outer sync, B = L = one cluster's pseudo-gradient frame through the codec, λ = 1.
- federated: one exchange per round, the partial up and the global model down one after another: B = up + down,
  L = the larger of the two, λ = 2.
- pipeline, synchronous, M micro-batches: the downstream end sends each micro-batch's gradient back at once while
  the next activation comes forward, and the upstream sends behind its next forward, so only the first
  activation and the last gradient are on the critical path: B = 2 x the larger direction's bytes of one
  micro-batch, λ = 2 (fill and drain), L = the larger direction's bytes of the whole step.
- pipeline, stale weights (N >= 1): the same bytes, overlapped; the round trip is shared by the N + 1 steps in
  flight, λ = 2 / (N + 1).
- one-cluster: no exchange (E = 0): the wall time is the compute.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from nebula.quality.rows import Traffic

__all__ = ["WanLink", "parse_link", "exchange_s", "carry_s", "predicted_wall_s"]


@dataclass(frozen=True)
class WanLink:
    """A WAN link: rate in Mbit/s and round-trip time in ms."""

    mbit: float
    rtt_ms: float = 0.0
    overhead_ms: float = 0.0  # fixed cost of one exchange on the path (relays, TLS, framing)
    burst_bytes: float = 0.0  # what a token-bucket shaper lets through at once (0: a real link)

    def __post_init__(self) -> None:
        if not self.mbit > 0 or not self.rtt_ms >= 0 or self.mbit == float("inf") or self.rtt_ms == float("inf") \
                or not self.overhead_ms >= 0 or not self.burst_bytes >= 0:
            raise ValueError(f"link: rate {self.mbit} Mbit/s must be a finite number > 0 and RTT {self.rtt_ms} ms a "
                             "finite number >= 0")

    def __str__(self) -> str:
        return f"{self.mbit:g} Mbit/s, {self.rtt_ms:g} ms RTT"


_PART = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(gbit|mbit|kbit|ms|s)\s*$", re.IGNORECASE)


def parse_link(text: str) -> WanLink:
    """'100mbit,20ms' (rate in gbit/mbit/kbit, RTT in ms or s) -> WanLink; ValueError saying the form otherwise."""
    rate, rtt = None, 0.0
    for part in str(text).split(","):
        m = _PART.match(part)
        if not m:
            raise ValueError(f"link {text!r}: {part.strip()!r} is neither a rate nor an RTT; write it as "
                             "RATE[,RTT], e.g. 100mbit,20ms or 1gbit,5ms")
        value, unit = float(m.group(1)), m.group(2).lower()
        if unit.endswith("bit"):
            if rate is not None:
                raise ValueError(f"link {text!r} gives two rates; write it as RATE[,RTT], e.g. 100mbit,20ms")
            rate = value * {"gbit": 1000.0, "mbit": 1.0, "kbit": 0.001}[unit]
        else:
            rtt = value * (1000.0 if unit == "s" else 1.0)
    if rate is None:
        raise ValueError(f"link {text!r} has no rate; write it as RATE[,RTT], e.g. 100mbit,20ms")
    if rate <= 0:
        raise ValueError(f"link {text!r}: the rate must be > 0; write it as RATE[,RTT], e.g. 100mbit,20ms")
    return WanLink(rate, rtt)


def exchange_s(nbytes: float, latencies: float, link: WanLink) -> float:
    """Seconds one exchange with `nbytes` on its critical path, waiting `latencies` one-way latencies, takes on
    `link`: serialisation (past the shaper's burst), propagation and the path's fixed cost."""
    return (max(0.0, nbytes - link.burst_bytes) * 8 / (link.mbit * 1e6) + latencies * link.rtt_ms / 2000.0
            + link.overhead_ms / 1000.0)


def carry_s(nbytes: float, link: WanLink) -> float:
    """Seconds `link` needs to carry `nbytes` in one direction at its rate."""
    return nbytes * 8 / (link.mbit * 1e6)


def predicted_wall_s(compute_s: float, traffic: Traffic, link: WanLink) -> float:
    """Wall time of a run whose critical-path compute is `compute_s` and whose WAN traffic is `traffic` (see the
    module docstring): compute plus the blocking exchanges, or the larger of the two when they run behind compute,
    never less than the time the link needs to carry the busier direction's bytes."""
    e = traffic.exchanges
    carried = e * carry_s(traffic.link_bytes, link)
    if traffic.overlapped:
        wait = traffic.latencies_per_exchange * link.rtt_ms / 2000.0 + link.overhead_ms / 1000.0
        return max(compute_s, carried + e * wait)
    return max(compute_s + e * exchange_s(traffic.bytes_per_exchange, traffic.latencies_per_exchange, link), carried)
