"""Audit checkpoints exchanged with peer switches: ours signed and sent, theirs verified against pinned keys.

Peers get our signed head every 30 s, within about a second of a security record (`is_security`: a refusal, a
revocation, a CRL or grant change), and once more as the closing checkpoint of a stop (`lifecycle.close_audit`):
what a peer holds no one on this host can rewrite, and `nebula-admin audit verify` finds records after it
SUSPICIOUS. A peer takes at most one CHECKPOINT per connection per second, so sends on one link are paced.
"""
from __future__ import annotations

__all__ = ["CheckpointExchange", "LINK_GAP_S", "is_security"]

import logging
import time
from typing import Any, Callable

from nebula.wire import FrameType, encode_frame
from security.audit import AuditLog, Checkpoint, verify_checkpoint
from security.errors import AuditError
from switch_server.framestream import write_frame
from switch_server.state import SwitchState

log = logging.getLogger(__name__)

PINNED_FILE = "peer_audit_keys.json"
# a peer ignores (and audits) a second CHECKPOINT on one connection within a second: ours are that far apart, with
# room for the network to bunch two of them up
LINK_GAP_S = 1.5
SECURITY_ACTIONS = frozenset({"route_refused", "own_certificate_revoked", "crl_reload", "route_grants_reload",
                              "reload"})


def is_security(action: str, outcome: str) -> bool:
    """Whether a record is one a peer should hold a signed head of at once: any refusal or error, and the changes
    of who may do what (CRL, grants, config)."""
    return outcome != "ok" or action in SECURITY_ACTIONS


class CheckpointExchange:
    """Signs our audit checkpoints for peers and keeps theirs (each peer's signing key is pinned on first use)."""

    def __init__(self, state: SwitchState, audit: Callable[..., None], actor: str) -> None:
        self.state = state
        self.audit = audit
        self.actor = actor
        self.log: AuditLog | None = None  # set once the switch has opened its audit log
        self._pinned = state.read_json(PINNED_FILE, {})
        self.closing = False  # our closing checkpoint is (being) written: peers' are kept beside the log only
        self._due = False  # a security record waits for a checkpoint the peers hold
        self._owed: set[str] = set()  # peers a checkpoint is owed to that pacing held back
        self._sent: dict[str, float] = {}  # peer -> when a checkpoint was last sent on our link to it
        self.last: Any = None  # our newest signed checkpoint (security.audit.Checkpoint), for the status file

    def frame(self) -> bytes | None:
        """A CHECKPOINT frame with a fresh signed checkpoint of our log; None if there is no log to sign."""
        if self.log is None:
            return None
        try:
            cp = self.log.checkpoint()
        except Exception:
            log.exception("cannot write an audit checkpoint")
            return None
        self.last = cp
        return encode_frame(FrameType.CHECKPOINT, {"checkpoint": cp.to_json()})

    def urgent(self) -> None:
        """A security record was written: sign and send a checkpoint at the next upkeep (at most one a second,
        covering every record written until then, however many)."""
        self._due = True

    def next_send(self, link: Any) -> float:
        """The monotonic time from which our link to `link.cluster` may carry another checkpoint."""
        last = max(self._sent.get(link.cluster, float("-inf")), link.last_checkpoint)
        return last + LINK_GAP_S

    def send(self, link: Any, now: float, session: Any = None) -> bool:
        """Send a fresh checkpoint to `link.cluster` unless pacing holds it back (then it is owed): on our link to
        it, else (the link down) on its session to us; whether it was sent."""
        on_link = link.up and link.writer is not None
        on_session = session is not None and not session.closed
        if not (on_link or on_session):
            self._owed.discard(link.cluster)
            return False
        ready = self.next_send(link)
        if not on_link:
            ready = max(ready, session.last_checkpoint + LINK_GAP_S)
        if now < ready:
            self._owed.add(link.cluster)
            return False
        if on_link:
            link.send_checkpoint()
        else:
            head = self.frame()
            if head is not None:
                write_frame(session.writer, head)
        self._sent[link.cluster] = now
        self._owed.discard(link.cluster)
        return True

    def upkeep(self, links: dict[str, Any], sessions: dict[str, Any], now: float, periodic: bool) -> None:
        """Once a second: the periodic checkpoint to every peer (on our links), or one owed after a security record
        (to every connected peer)."""
        if self._due:
            self._due = False
            self._owed = set(links)
        for cluster, link in links.items():
            if cluster in self._owed:
                self.send(link, now, sessions.get(cluster))
            elif periodic:
                self.send(link, now)

    def receive(self, cluster: str, text: str) -> None:
        """Verify a peer's checkpoint against its pinned key and keep it (audited if it fails)."""
        try:
            cp = Checkpoint.from_json(text)
            pinned = self._pinned.get(cluster)
            if pinned is not None and pinned["signer"] != cp.signer:
                raise AuditError(f"signed by a key other than the one pinned for cluster {cluster}")
            if pinned is not None and cp.seq < pinned["seq"]:
                raise AuditError(f"its seq {cp.seq} is below seq {pinned['seq']} seen before: the log was rewound")
            verify_checkpoint(cp)
            assert self.log is not None
            # while we close, a peer's head (its own closing one, when both stop) is kept beside our log: a record
            # after our closing checkpoint would be one no peer holds
            self.log.store_peer_checkpoint(cluster, cp, final=self.closing, in_chain=not self.closing)
        except AuditError as exc:
            log.warning("checkpoint from %s refused: %s", cluster, exc)
            if not self.closing:
                self.audit(self.actor, "peer_checkpoint_rejected", cluster, "denied", {"reason": str(exc)[:300]})
            return
        self._pinned[cluster] = {"signer": cp.signer, "seq": cp.seq}
        self.state.write_json(PINNED_FILE, self._pinned)
