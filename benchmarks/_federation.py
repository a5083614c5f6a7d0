"""A throwaway federation for benchmarks: the tests' local federation (`tests.harness.federation`), links shaped."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the checkout, for `tests.harness`

from tests.harness.federation import LocalFederation  # noqa: E402

__all__ = ["Federation"]


def Federation(root: Path, clusters: list[str], rate_mbit: float | None, delay_ms: float = 0.0,
               name: str = "bench") -> LocalFederation:
    """Clusters provisioned under `root`, each with its switch server, links shaped to `rate_mbit` (None: unshaped);
    `close()` stops them."""
    shape = {"rate_mbit": rate_mbit, "delay_ms": delay_ms} if rate_mbit else None
    return LocalFederation(Path(root), clusters, shape=shape, name=name)
