"""The smallest size of a printed command: with NEBULA_SMOKE=1 in the environment, every benchmark and recipe a
README prints runs its whole path (every row, stage and table) at the smallest size that still exercises it, in
seconds to a minute. This is how CI runs each printed command exactly as printed; the figures beside a command in a
README are always from a run without it.

Shell scripts read the same variable (`[ -n "${NEBULA_SMOKE:-}" ]`); Python reads it through `active` and `pick`.
"""
from __future__ import annotations

import os
from typing import TypeVar

__all__ = ["ENV", "active", "pick", "cap"]

ENV = "NEBULA_SMOKE"
T = TypeVar("T")


def active() -> bool:
    """Whether this process runs at the smallest size (NEBULA_SMOKE set to anything but empty or 0)."""
    return os.environ.get(ENV, "") not in ("", "0")


def pick(full: T, smallest: T) -> T:
    """`smallest` under NEBULA_SMOKE, else `full`: one place that says which size a run takes."""
    return smallest if active() else full


def cap(value: int | float, smallest: int | float) -> int | float:
    """`value` (e.g. a printed `--steps 6000`), capped at `smallest` under NEBULA_SMOKE: a size given on the command
    line shrinks too, so the printed command itself runs small."""
    return min(value, smallest) if active() else value
