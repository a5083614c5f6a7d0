"""Audit checkpoints exchanged with peer switches: ours signed and sent, theirs verified against pinned keys."""
from __future__ import annotations

__all__ = ["CheckpointExchange"]

import logging
from typing import Callable

from nebula.wire import FrameType, encode_frame
from security.audit import AuditLog, Checkpoint, verify_checkpoint
from security.errors import AuditError
from switch_server.state import SwitchState

log = logging.getLogger(__name__)

PINNED_FILE = "peer_audit_keys.json"


class CheckpointExchange:
    """Signs our audit checkpoints for peers and keeps theirs (each peer's signing key is pinned on first use)."""

    def __init__(self, state: SwitchState, audit: Callable[..., None], actor: str) -> None:
        self.state = state
        self.audit = audit
        self.actor = actor
        self.log: AuditLog | None = None  # set once the switch has opened its audit log
        self._pinned = state.read_json(PINNED_FILE, {})

    def frame(self) -> bytes | None:
        """A CHECKPOINT frame with a fresh signed checkpoint of our log; None if there is no log to sign."""
        if self.log is None:
            return None
        try:
            cp = self.log.checkpoint()
        except Exception:
            log.exception("cannot write an audit checkpoint")
            return None
        return encode_frame(FrameType.CHECKPOINT, {"checkpoint": cp.to_json()})

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
            self.log.store_peer_checkpoint(cluster, cp)
        except AuditError as exc:
            log.warning("checkpoint from %s refused: %s", cluster, exc)
            self.audit(self.actor, "peer_checkpoint_rejected", cluster, "denied", {"reason": str(exc)[:300]})
            return
        self._pinned[cluster] = {"signer": cp.signer, "seq": cp.seq}
        self.state.write_json(PINNED_FILE, self._pinned)
