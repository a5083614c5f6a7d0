"""The controller as witness of the combiners' audit logs.

A combiner's log stands alone (no switch chain signs it), so each combiner sends its signed checkpoint
(security.audit.Checkpoint) with every status answer, every partial and its last word at the end of the run. The
controller verifies each one, pins the first signing key seen per combiner (kept in `combiner_audit_keys.json`
beside its log, so a restarted controller keeps the pins), refuses one signed by another key or with a lower seq
than seen before (a rewritten or rewound log), and keeps the good ones in its own log
(`AuditLog.store_peer_checkpoint("combiner-<cluster>", ...)`: the file `audit.log.peers/combiner-<cluster>.checkpoints`
beside the controller's log, and a record in its chain). `nebula-admin audit verify --log <combiner log>
--peer-dir <controller dir>` checks a combiner's log against them.

A pinned key is on disk before the checkpoint that brought it is taken. A pin's seq rises with every message (a round
or more): it is written with a run's last checkpoint and otherwise at most once per `save_every_s` (PEER_RECORD_MIN_S,
the interval at which the controller's log keeps a combiner's checkpoint), so after a crash of the controller the pins
lag the newest checkpoint it saw by at most that interval, as its log does.
"""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any, Callable

__all__ = ["CombinerWitness", "PINS_FILE", "witness_name"]

log = logging.getLogger(__name__)
PINS_FILE = "combiner_audit_keys.json"


def witness_name(cluster: str) -> str:
    """The peer name under which the controller keeps `cluster`'s combiner checkpoints."""
    return f"combiner-{cluster}"


class CombinerWitness:
    """Verifies and keeps the combiners' checkpoints in the controller's audit log `audit_log` (an AuditLog);
    `record(action, target, outcome, detail)` audits a refusal."""

    def __init__(self, directory: str | Path, audit_log: Any, record: Callable[[str, str, str, dict], None],
                 save_every_s: float | None = None) -> None:
        from security.audit import PEER_RECORD_MIN_S

        self.path = Path(directory) / PINS_FILE
        self.log, self.record = audit_log, record
        self.save_every_s = PEER_RECORD_MIN_S if save_every_s is None else save_every_s
        self._saved = float("-inf")  # when the pins were last written (monotonic)
        self._unsaved = False  # whether a pin changed since
        try:
            self.pins: dict[str, dict] = json.loads(self.path.read_text()) if self.path.exists() else {}
        except ValueError:
            raise ValueError(f"{self.path} is not JSON; restore it from a backup (or delete it to pin the keys "
                             "the combiners use next)") from None
        self._stored: dict[str, float] = {}  # when a checkpoint of each combiner was last kept
        self._refused: dict[str, str] = {}  # the last refusal per combiner (audited once, not per status)

    def receive(self, cluster: str, text: Any, final: bool = False) -> str | None:
        """Verify and keep `cluster`'s checkpoint (JSON); the reason it was refused, or None. `final`: the last of
        the run, kept even if one was kept a moment ago."""
        from security.audit import PEER_RECORD_MIN_S, Checkpoint, verify_checkpoint
        from security.errors import AuditError

        name = witness_name(cluster)
        try:
            if not isinstance(text, str) or len(text) > 4096:
                raise AuditError("no checkpoint (a JSON string of at most 4096 characters) came with the message")
            cp = Checkpoint.from_json(text)
            pin = self.pins.get(name)
            if pin is not None and pin["signer"] != cp.signer:
                raise AuditError(f"signed by a key other than the one pinned for {name} ({pin['signer'][:12]}...); "
                                 f"if that combiner's key was replaced on purpose, remove its entry from {self.path}")
            if pin is not None and cp.seq < pin["seq"]:
                raise AuditError(f"its seq {cp.seq} is below seq {pin['seq']} seen before: the log was rewound")
            verify_checkpoint(cp)
        except AuditError as exc:
            why = str(exc)[:300]
            if self._refused.get(name) != why:
                self._refused[name] = why
                log.warning("controller: audit checkpoint of %s refused: %s", name, why)
                self.record("fl.witness", name, "refused", {"reason": why})
            return why
        self._refused.pop(name, None)
        if final:  # the audit log keeps one per PEER_RECORD_MIN_S: wait that out for the last one of the run
            time.sleep(max(0.0, self._stored.get(name, 0.0) + PEER_RECORD_MIN_S - time.monotonic()))
        self.log.store_peer_checkpoint(name, cp)
        self._stored[name] = time.monotonic()
        if pin is None or cp.seq > pin["seq"]:
            self.pins[name] = {"signer": cp.signer, "seq": cp.seq}
            self._unsaved = True
        # a new key at once; a higher seq with the run's last checkpoint, else once per save_every_s
        if self._unsaved and (pin is None or final or time.monotonic() - self._saved >= self.save_every_s):
            self._save()
        return None

    def _save(self) -> None:
        from security._files import atomic_write

        atomic_write(self.path, json.dumps(self.pins, sort_keys=True).encode())
        self._saved, self._unsaved = time.monotonic(), False
