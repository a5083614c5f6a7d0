"""Identity-bound routing: what a peer switch may put on its session is bounded by what its certificate proved.

A frame from peer P must name P's cluster as the far end of its channel (the sender of DATA, the acknowledging
side of ACK, the refused sender's peer of ERROR), may address only accounts P may reach here (`peers[].accounts`,
and only accounts with workers on this switch) and jobs those workers may join, and may name only incarnations of
P's ranks that P's switch can have given (`switch_server.incarnations`). An ENDED notice is bounded the same way.
"""
from __future__ import annotations

__all__ = ["PeerPolicy"]

from typing import Any

from nebula.config import SwitchConfig
from nebula.wire import ChannelKey, FrameType
from switch_server.incarnations import peer_inc_refusal


class PeerPolicy:
    """Checks each routed frame of a peer session against the peer's proven cluster and what it may reach."""

    def __init__(self, cfg: SwitchConfig) -> None:
        self.cluster = cfg.cluster
        self.jobs: dict[str, set[str]] = {}  # account -> jobs its workers here may join ("*": any)
        for w in cfg.local.workers:
            self.jobs.setdefault(w.account, set()).update(w.jobs)
        self.accounts = {p.cluster: frozenset(p.accounts) for p in cfg.peers}

    def check(self, peer: str, frame: Any, epoch: int) -> tuple[str, str] | None:
        """(reason code, message) if peer `peer` (at boot `epoch`) may not send `frame` here; None if it may."""
        t = frame.type
        if t == FrameType.ENDED:
            return self._reachable(peer, frame.meta["account"], frame.meta["job"]) or self._inc(peer, epoch, frame)
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
        return self._reachable(peer, key.account, key.job) or (self._inc(peer, epoch, frame) if t != FrameType.ERROR
                                                                else None)

    def _reachable(self, peer: str, account: str, job: str) -> tuple[str, str] | None:
        allowed = self.accounts.get(peer, frozenset())
        if "*" not in allowed and account not in allowed:
            return ("account_not_reachable", f"peer {peer!r} may not address account {account!r} of cluster "
                    f"{self.cluster!r}; add it to that peer's accounts in switch.yaml to allow it")
        jobs = self.jobs.get(account)
        if jobs is None:
            return ("account_not_reachable", f"account {account!r} has no workers on cluster {self.cluster!r}")
        if "*" not in jobs and job not in jobs:
            return ("job_not_reachable", f"job {job!r} of account {account!r} has no workers on cluster "
                    f"{self.cluster!r} (its workers may join: {', '.join(sorted(jobs))})")
        return None

    @staticmethod
    def _inc(peer: str, epoch: int, frame: Any) -> tuple[str, str] | None:
        why = peer_inc_refusal(peer, epoch, frame.meta)
        return None if why is None else ("bad_incarnation", why)
