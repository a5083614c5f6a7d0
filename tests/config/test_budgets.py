"""nebula.config.budgets.resolve: the budgets a switch enforces, derived once from link and limits."""
from __future__ import annotations

import dataclasses

from nebula.config import LimitsConfig, LinkConfig, LocalConfig, PeerConfig
from nebula.config.budgets import resolve
from nebula.config.switch import AuditConfig, SwitchConfig, TLSFiles

MIB = 1024**2


def _cfg(**over) -> SwitchConfig:
    base = SwitchConfig(federation="f", cluster="A", listen="127.0.0.1:0", tls=TLSFiles(ca="c", cert="c", key="k", crl="r"),
                        local=LocalConfig(endpoint="tcp://127.0.0.1:0", curve_secret_key="s"),
                        audit=AuditConfig(log="l", signing_key="s"),
                        peers=(PeerConfig(cluster="B", address="h:1"), PeerConfig(cluster="C", address="h:2")))
    return dataclasses.replace(base, **over)


def test_budgets_left_out_are_derived_from_the_memory_cap():
    b = resolve(_cfg(link=LinkConfig(memory_cap_bytes=256 * MIB)))
    assert (b.memory_cap, b.peer_window, b.account, b.pending) == (256 * MIB, 128 * MIB, 128 * MIB, 32 * MIB)
    assert b.arenas == 256 * MIB and b.arena == 2 * 64 * MIB  # (local.shm_bytes per direction)


def test_budgets_given_are_kept_and_a_peer_window_holds_four_chunks():
    limits = LimitsConfig(peer_memory_bytes=MIB, account_memory_bytes=3 * MIB, pending_bytes=5 * MIB)
    b = resolve(_cfg(link=LinkConfig(memory_cap_bytes=64 * MIB, chunk_bytes=2 * MIB), limits=limits))
    assert (b.peer_window, b.account, b.pending) == (8 * MIB, 3 * MIB, 5 * MIB)
    assert resolve(_cfg(peers=())).peer_window == 512 * MIB  # no peer: the whole default cap
