"""`nebula-switch reload --update`: check a peers update, audit the decision in the switch's own log, write it.

The record goes into the switch's audit log (its actor, its signing key; several processes may append to one log)
before anything is written: an update taken is recorded with who signed it (the CA key's fingerprint), its revision
and CRL number; a refused one with the reason. A log that cannot be written refuses the update (fail closed).
"""
from __future__ import annotations

__all__ = ["take_update"]

from pathlib import Path

from nebula.config import SwitchConfig
from security.audit import AuditLog, default_actor
from security.errors import SecurityError
from security.updates import UpdateError, check_update, install_update


def _audit(cfg: SwitchConfig, update: Path, outcome: str, detail: dict) -> None:
    with AuditLog(cfg.audit.log, cfg.audit.signing_key, checkpoint_every=cfg.audit.checkpoint_every) as log:
        log.append(f"switch:{cfg.cluster}", "peers_update", update.name[:200], outcome,
                   {**detail, "by": default_actor()})


def take_update(cfg: SwitchConfig, config: Path, update: Path) -> tuple[bool, str]:
    """(refused, one line): the update applied to the kit of `config` (switch.yaml, loaded as `cfg`), or why not."""
    try:
        pending = check_update(config, update)
    except UpdateError as exc:
        try:
            _audit(cfg, update, "denied", {"reason": exc.reason, "detail": str(exc)[:300]})
        except (SecurityError, OSError) as audit_exc:
            return True, f"{exc} (and the refusal could not be audited: {audit_exc})"
        return True, str(exc)
    try:
        _audit(cfg, update, "ok", pending.audit_detail())
    except (SecurityError, OSError) as exc:
        return True, (f"{update} not applied: it cannot be audited in {cfg.audit.log} ({exc}); fix the audit log "
                      "(`nebula-admin audit verify --log ...`) and apply it again")
    try:
        return False, install_update(pending)
    except (SecurityError, OSError) as exc:
        return True, f"{update} was checked but could not be written into the kit ({exc}); apply it again"
