"""The verdict on an audit log: its chain and checkpoints (`verify_log`) weighed with the evidence held outside it
(`security.audit_evidence`). EXIT_HELP lists the verdicts and their exit codes."""
from __future__ import annotations

import os
from dataclasses import dataclass, replace

from security.audit_evidence import Evidence
from security.audit_verify import VerifyReport, verify_log

__all__ = ["Verdict", "judge", "EXIT_CODES", "USAGE_EXIT", "EXIT_HELP"]

EXIT_CODES = {"ok": 0, "tampered": 1, "suspicious": 3, "unverifiable": 4}
USAGE_EXIT = 2  # argparse's code for a command line that cannot run
EXIT_HELP = """\
  0  OK            chain and signed checkpoints intact, signed by the pinned key; for a switch's or a federated
                   combiner's or controller's log that key or a checkpoint is vouched for from outside the log's
                   directory (a peer's pinned key or copies of its checkpoints, --key, --witness)
  1  TAMPERED      a record or checkpoint is provably wrong (edited, deleted, inserted, reordered, rewritten,
                   truncated, re-signed with another key than the pinned one); the first bad record is named
  2  usage error   no such log, an unreadable --key, --witness or --peer-dir (nothing was judged)
  3  SUSPICIOUS    nothing provably wrong, but evidence that must be there is missing (an empty log of a writer
                   that has run, no signed checkpoint, a long unsigned tail, records of a switch's or combiner's
                   log after the last checkpoint its witnesses hold) or the pinned keys disagree
  4  UNVERIFIABLE  nothing can vouch for it: no key pinned, a switch's key pinned only by files beside its log,
                   or an empty log that no witness or sign of use speaks for; never OK
"""


@dataclass(frozen=True, slots=True)
class Verdict:
    """`kind` (a key of EXIT_CODES), why, the fix (None when ok), the evidence used, and the chain report."""

    kind: str
    reason: str
    fix: str | None
    used: str
    report: VerifyReport

    @property
    def code(self) -> int:
        """The exit code of `nebula-admin audit verify` for this verdict."""
        return EXIT_CODES[self.kind]

    def line(self, log: str | os.PathLike) -> str:
        """One line: verdict, log, first bad record, reason, evidence used and the fix."""
        first = f"first bad record {self.report.first_bad}: " if self.report.first_bad is not None else ""
        fix = f"; fix: {self.fix}" if self.fix else ""
        return f"{self.kind.upper()} {log}: {first}{self.reason}; {self.used}{fix}"


def _peer_hint(ev: Evidence) -> str:
    if ev.peers:
        return f"the directory of peer {' or '.join(ev.peers[:4])} (copied from its host)"
    return "a peer's directory (copied from its host; for a combiner, the controller's workdir)"


def judge(log: str | os.PathLike, ev: Evidence) -> Verdict:
    """Verify the log at `log` against the pins and witnesses in `ev` and weigh the result (see EXIT_HELP).

    The key checked is the first pin from outside the log's directory (the admin's, then peers'), else one beside
    it; any other pin that disagrees makes the log suspicious.
    """
    pins = [p for p in ev.pins if p.outside] + [p for p in ev.pins if not p.outside]
    pin = pins[0] if pins else None
    report = verify_log(log, witnesses=ev.witnesses, signer=pin.signer if pin else None,
                        pin_source=pin.source if pin else None, has_run=ev.has_run)
    used = (f"key pinned from {pin.source}" if pin else "no pinned key") + "".join(
        f"; witness checkpoints: {s}" for s in ev.witness_sources)
    if ev.federated and not ev.witnesses:
        used += "; no witness (a cut back to an earlier checkpoint would not show)"
    peer_fix = f"pass --peer-dir with {_peer_hint(ev)}, or --key with the writer's public key kept off this host"
    if not report.ok:
        fixes = {"tampered": "keep this file as evidence; the records named cannot be trusted: compare them with a "
                             "backup and the peers' copies, and find who could write this host's files",
                 "suspicious": "keep this file as evidence and compare it with a backup and the peers' copies; find "
                               "who could write this host's files",
                 "unverifiable": f"{peer_fix}; an empty log is never OK on its own"}
        return Verdict(report.kind, report.reason, fixes[report.kind], used, report)
    if pin is None:
        return Verdict("unverifiable", f"{report.reason}, but no key is pinned for it: nothing outside the log says "
                                       "which key must sign it", peer_fix, used, report)
    other = next((p for p in pins if p.signer != pin.signer), None)
    if other is not None:
        return Verdict("suspicious", f"{report.reason}, but the pinned keys disagree: {pin.source} pins "
                                     f"{pin.signer[:12]}..., {other.source} pins {other.signer[:12]}... (the "
                                     "signing key was replaced)", "find which key is the writer's and who replaced "
                                                                  "the other; keep this file as evidence", used, report)
    if ev.federated and not pin.outside:
        return Verdict("unverifiable", f"{report.reason}, but {ev.federated} and its key is pinned only by "
                                       f"{pin.source}, beside it, which whoever can rewrite the log can replace; no "
                                       f"peer's pinned key or copy of its checkpoints was found"
                                       f"{' in ' + ', '.join(ev.peer_dirs[:4]) if ev.peer_dirs else ''}",
                       peer_fix, used, report)
    if ev.federated and report.witnessed is not None and report.unwitnessed > 0:
        return _unwitnessed(report, used)
    return Verdict("ok", report.reason, None, used, report)


def _unwitnessed(report: VerifyReport, used: str) -> Verdict:
    """A log whose records after the last checkpoint a witness holds no one outside its host can vouch for."""
    w, k = report.witnessed, report.unwitnessed
    assert w is not None
    end = ("it ends with a clean stop, but no witness holds its closing checkpoint" if report.clean_stop else
           "it does not end with a clean stop whose closing checkpoint a witness holds")
    reason = (f"{report.reason}, but {k} records after seq {w}, the last checkpoint a witness holds, are unwitnessed "
              f"({end}): a cut back to seq {w} with the records after it dropped and chained again would look the "
              "same")
    fix = ("if its writer still runs, verify again with fresh copies of the peers' directories once its next "
           "checkpoint reached them (every 30 s, within seconds of a refusal); if it stopped while no peer ran (the "
           "last switch to stop, or one cut off), start it again while a peer runs, stop it, and copy the directories "
           "again; otherwise keep this file as evidence and compare its last records with a backup")
    return Verdict("suspicious", reason, fix, used,
                   replace(report, ok=False, first_bad=w + 1, kind="suspicious"))
