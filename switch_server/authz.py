"""Identity-bound routing: what a peer switch may put on its session is bounded by what its certificate proved.

A frame from peer P must name P's cluster as the far end of its channel (the sender of DATA, the acknowledging
side of ACK, the refused sender's peer of ERROR), and may address only accounts P may reach here (`peers[].accounts`,
and only accounts with workers on this switch) and jobs those workers may join.
"""
from __future__ import annotations

__all__ = ["PeerPolicy"]

from typing import Any

from nebula.config import SwitchConfig
from nebula.wire import ChannelKey, FrameType


class PeerPolicy:
    """Checks each routed frame of a peer session against the peer's proven cluster and what it may reach."""

    def __init__(self, cfg: SwitchConfig) -> None:
        self.cluster = cfg.cluster
        self.jobs: dict[str, set[str]] = {}  # account -> jobs its workers here may join ("*": any)
        for w in cfg.local.workers:
            self.jobs.setdefault(w.account, set()).update(w.jobs)
        self.accounts = {p.cluster: frozenset(p.accounts) for p in cfg.peers}

    def check(self, peer: str, frame: Any) -> tuple[str, str] | None:
        """(reason code, message) if peer `peer` may not send `frame` here; None if it may."""
        t = frame.type
        if t == FrameType.ERROR:
            ch = frame.meta.get("channel")
            if ch is None:
                return None  # a report about the link itself: only logged
            key = ChannelKey.from_meta(ch)
            far = key.dst_cluster
        else:
            key = frame.key()
            far = key.src_cluster if t == FrameType.DATA else key.dst_cluster
        if far != peer:
            return ("wrong_source", f"frame names cluster {far!r} as its source, but it came on the session of peer "
                    f"{peer!r}, whose certificate proves cluster {peer!r}; a switch may relay only its own cluster")
        allowed = self.accounts.get(peer, frozenset())
        if "*" not in allowed and key.account not in allowed:
            return ("account_not_reachable", f"peer {peer!r} may not address account {key.account!r} of cluster "
                    f"{self.cluster!r}; add it to that peer's accounts in switch.yaml to allow it")
        jobs = self.jobs.get(key.account)
        if jobs is None:
            return ("account_not_reachable", f"account {key.account!r} has no workers on cluster {self.cluster!r}")
        if "*" not in jobs and key.job not in jobs:
            return ("job_not_reachable", f"job {key.job!r} of account {key.account!r} has no workers on cluster "
                    f"{self.cluster!r} (its workers may join: {', '.join(sorted(jobs))})")
        return None
