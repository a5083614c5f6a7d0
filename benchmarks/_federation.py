"""A throwaway federation for benchmarks: the test bed's local federation (`testbed.federation`), links shaped."""
from __future__ import annotations

from pathlib import Path

from testbed.federation import LocalFederation

__all__ = ["Federation"]


def Federation(root: Path, clusters: list[str], rate_mbit: float | None, delay_ms: float = 0.0,
               name: str = "bench") -> LocalFederation:
    """Clusters provisioned under `root`, each with its switch server, links shaped to `rate_mbit` (None: unshaped);
    `close()` stops them."""
    shape = {"rate_mbit": rate_mbit, "delay_ms": delay_ms} if rate_mbit else None
    return LocalFederation(Path(root), clusters, shape=shape, name=name)
