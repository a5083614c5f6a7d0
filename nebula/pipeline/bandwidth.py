"""Live link bandwidth to bandwidth-adaptive codecs: the throughput a link measured reaches every auto(...) it sends with."""
from __future__ import annotations

from typing import Any, Callable, Iterable

__all__ = ["adaptive_codecs", "BandwidthFeed"]


def adaptive_codecs(codec: Any) -> list[Any]:
    """`codec` and the codecs nested in it (ef(auto(...)), ...) that take update_bandwidth(bytes_per_s)."""
    out, node = [], codec
    while node is not None:
        if callable(getattr(node, "update_bandwidth", None)):
            out.append(node)
        node = getattr(node, "inner", None)
    return out


class BandwidthFeed:
    """Passes a link's measured throughput to the adaptive codecs of one direction.

    `measure` returns the link's current estimate in bytes/s (None while it has none). A new estimate is passed on
    when it differs from the last one passed by more than `rel_change` (re-deciding costs a little each time);
    a codec seen for the first time gets the current estimate at once.
    """

    def __init__(self, measure: Callable[[], float | None], *, rel_change: float = 0.2) -> None:
        if not rel_change >= 0:
            raise ValueError(f"rel_change={rel_change!r} must be >= 0 (0 passes on every new estimate)")
        self.measure, self.rel_change = measure, rel_change
        self.fed_bytes_per_s: float | None = None  # the estimate last passed on
        self._fed: set[int] = set()  # ids of codecs that have the current estimate
        self.updates = 0  # how many times an estimate was passed on

    def feed(self, codecs: Iterable[Any]) -> float | None:
        """Pass the link's estimate to the adaptive codecs among `codecs` when it changed or they are new."""
        targets = [a for c in codecs for a in adaptive_codecs(c)]
        if not targets:
            return self.fed_bytes_per_s
        bps = self.measure()
        if bps is None or not bps > 0:
            return self.fed_bytes_per_s
        last = self.fed_bytes_per_s
        if last is None or abs(bps - last) > self.rel_change * last:
            self.fed_bytes_per_s, self._fed = bps, set()
        for a in targets:
            if id(a) not in self._fed:
                a.update_bandwidth(self.fed_bytes_per_s)
                self._fed.add(id(a))
                self.updates += 1
        return self.fed_bytes_per_s
