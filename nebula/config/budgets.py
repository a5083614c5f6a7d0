"""The memory budgets a switch enforces, derived once from `link` and `limits` of its switch.yaml.

`link.memory_cap_bytes` bounds every byte the switch queues; the budgets under `limits` divide it, and where one is
left out it is derived from the cap here (and nowhere else): a peer's credit window is the cap over the number of
peers (at least four chunks, so a link never stalls on one frame), one local account may queue half of it while
other accounts work, frames held for one account's ranks that have not connected may take an eighth, and the
shared-memory arenas of same-host workers (2 x `local.shm_bytes` each) may take the whole cap together: beyond
that, the pages of every region handed back go back to the kernel at once (`switch_server.localshm.ArenaLedger`);
the slots where workers' shared payloads are kept (`nebula.wire.share`) may take an eighth, all connections together.
"""
from __future__ import annotations

__all__ = ["Budgets", "resolve"]

from dataclasses import dataclass

from nebula.config.switch import SwitchConfig


@dataclass(frozen=True, slots=True)
class Budgets:
    """Bytes the switch lets each kind of holder queue (see the module docstring)."""

    memory_cap: int  # everything queued; readers are held back beyond it
    peer_window: int  # one peer's credit: its frames queued here
    account: int  # one local account's queued frames while other accounts work here
    pending: int  # frames held for one account's ranks that have not connected
    arenas: int  # all same-host workers' shared-memory arenas together, before freed pages are given back
    arena: int  # one worker's arena, both directions (0: arenas off)
    shared: int  # the slots of all stream connections together, where a worker's payload goes once for many frames


def resolve(cfg: SwitchConfig) -> Budgets:
    """The budgets of `cfg` (pure: called at start-up and again on every reload)."""
    cap, limits = cfg.link.memory_cap_bytes, cfg.limits
    peer = limits.peer_memory_bytes or cap // max(1, len(cfg.peers))
    return Budgets(
        memory_cap=cap,
        peer_window=max(4 * cfg.link.chunk_bytes, peer),
        account=limits.account_memory_bytes or cap // 2,
        pending=limits.pending_bytes or cap // 8,
        arenas=cap,
        arena=2 * cfg.local.shm_bytes,
        shared=cap // 8,
    )
