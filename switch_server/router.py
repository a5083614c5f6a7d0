"""Routing between the local side and the peer links: where a DATA, ACK or ERROR frame goes on to, the route and
stage grants of the frames local workers send to other clusters, ENDED notices, and refusals told to a peer's
worker."""
from __future__ import annotations

__all__ = ["Router"]

import logging
from typing import Any

from nebula.wire import ChannelKey, FrameType, Lane, encode_frame
from switch_server.budget import Party
from switch_server.host import Origin

log = logging.getLogger("switch_server.server")


class Router:
    """The switch's routing decisions; `server` is the switch (its config, links, local side, grants, audit)."""

    def __init__(self, server: Any) -> None:
        self.server = server

    def route(self, frame: Any, head: bytes, payload: Any, origin: Origin | None,
              from_peer: str | None = None, party: Party | None = None,
              stages: tuple[str, ...] = ()) -> tuple[str, str] | None:
        """Send a DATA/ACK/ERROR frame on towards its destination, its bytes charged to `party` (the local account
        that sent it; `stages`: those its job runs here and at the destination cluster, checked against the
        account's stage grants); return (code, reason) if it cannot go anywhere."""
        t = frame.type
        if t == FrameType.ERROR:
            ch = frame.meta.get("channel")
            if ch is None:
                log.warning("peer %s reports: %s: %s", from_peer, frame.meta["code"], frame.meta["message"])
                if origin is not None:
                    origin.release(len(head) + len(payload))
                return None
            key = ChannelKey.from_meta(ch)
        else:
            key = frame.key()
        src = None
        if t == FrameType.DATA:
            cluster, rank, lane = key.dst_cluster, key.dst_rank, frame.header.lane
            src = (key.src_cluster, key.src_rank, frame.meta.get("inc", 0))
        else:
            cluster, rank, lane = key.src_cluster, key.src_rank, Lane.CONTROL
        if cluster == self.server.cfg.cluster:
            if t == FrameType.ACK:
                refused = self.server.local.ack_refusal(frame)
                if refused is not None:
                    if refused[2]:
                        return refused[0], refused[1]
                    self.server.metrics.refused.labels(reason=refused[0]).inc()  # (quietly: an earlier start's ACK)
                    if origin is not None:
                        origin.release(len(head) + len(payload))
                    return None
            return self.server.local.deliver(key, rank, lane, head, payload, origin, party, src)
        if from_peer is not None:
            return "unknown_destination", f"switch {self.server.cfg.cluster} does not relay to cluster {cluster!r}"
        if t in (FrameType.DATA, FrameType.ACK):  # (every frame a worker sends to another cluster)
            why = self.server.route_grants.refusal(key.account, cluster, stages)
            if why is not None:
                return self.route_refused(key.account, cluster, why, stages)
        link = self.server.links.get(cluster)
        if link is None:
            known = ", ".join(sorted(self.server.links)) or "none"
            return "unknown_destination", f"no route to cluster {cluster!r}; this switch knows: {known}"
        link.enqueue(lane, head, payload, party)
        return None

    def incarnation_ended(self, account: str, job: str, rank: int, inc: int) -> None:
        """A start of one of our ranks ended (BYE, replaced by a later start, or long silent): what it sent that
        waits for ranks not connected, here or at any peer, expires (it is meant for no later start of them)."""
        self.server.local.delivery.sender_ended(account, job, self.server.cfg.cluster, rank, inc)
        head = encode_frame(FrameType.ENDED, {"account": account, "job": job, "rank": rank, "inc": inc})
        for link in self.server.links.values():
            link.enqueue(Lane.CONTROL, head, b"")

    def peer_incarnation_ended(self, peer: str, meta: dict[str, Any]) -> None:
        """A peer says a start of one of its ranks ended."""
        n = self.server.local.delivery.sender_ended(meta["account"], meta["job"], peer, meta["rank"], meta["inc"])
        if n:
            log.info("dropped %d frames held from ended start %d of %s/%d (job %s)", n, meta["inc"], peer,
                     meta["rank"], meta["job"])

    def route_refused(self, account: str, cluster: str, why: str, stages: tuple[str, ...] = ()) -> tuple[str, str]:
        """Count and audit (rate-limited) a local worker's frame (or registration) to a cluster or stage its
        account holds no grant for."""
        known = cluster if cluster in self.server.links or cluster == self.server.cfg.cluster else "unknown"  # (bounded labels)
        self.server.metrics.route_refused.labels(account=account, cluster=known).inc()
        detail: dict[str, Any] = {"account": account, "cluster": cluster, "reason": why}
        if stages:
            detail["stages"] = list(stages)
        self.server.audit_limited(("route_refused", account, known, bool(stages)), self.server.actor, "route_refused", account,
                           "denied", detail)
        return "not_authorized", why

    def refuse_remote(self, frame: Any, code: str, message: str) -> None:
        """Tell the original sender (a worker of a peer cluster) why its frame was refused here."""
        self.server.metrics.refused.labels(reason=code).inc()
        if frame.type not in (FrameType.DATA, FrameType.ACK):
            return
        key = frame.key()
        head = encode_frame(FrameType.ERROR, {"code": code, "message": message, "channel": key.to_meta()},
                            seq=frame.header.seq)
        link = self.server.links.get(key.src_cluster)
        if link is not None:
            link.enqueue(Lane.CONTROL, head, b"")
