"""Whether a local worker's DATA or ACK may go on, and whether an ACK may reach one of our ranks: pure rules over
the frame and the sender's registration (the local side does the I/O and the refusing)."""
from __future__ import annotations

__all__ = ["ack_refusal", "attribution_refusal"]

from nebula.wire import Frame, FrameType
from switch_server.registry import Registration, WorkerRegistry


def attribution_refusal(frame: Frame, reg: Registration, cluster: str) -> tuple[str, str] | None:
    """(code, reason) if a worker's DATA or ACK speaks for another account, job, rank or start of its rank than its
    connection's registration, or opens more sending channels than one connection may; None if it is its own."""
    t = frame.type
    key = frame.key()
    me = (key.src_cluster, key.src_rank) if t == FrameType.DATA else (key.dst_cluster, key.dst_rank)
    if key.account != reg.account or key.job != reg.job or me != (cluster, reg.rank):
        return "not_attributed", (f"frame names account {key.account!r} job {key.job!r} endpoint {me}, but this "
                                  f"connection is account {reg.account!r} job {reg.job!r} rank {reg.rank} of cluster "
                                  f"{cluster!r}")
    inc = frame.meta.get("inc", 0)
    if inc != reg.inc:
        return "bad_incarnation", (f"frame names incarnation {inc}, but this connection is incarnation {reg.inc} of "
                                   f"rank {reg.rank} (given in its WELCOME)")
    if t == FrameType.DATA and not reg.note_sent(frame.header.channel_id, frame.last_seq):
        return "too_many_channels", (f"rank {reg.rank} has opened {len(reg.sent)} sending channels on this switch, "
                                     "the most one connection may; reuse channels")
    return None


def ack_refusal(frame: Frame, registry: WorkerRegistry) -> tuple[str, str, bool] | None:
    """For an ACK to one of our ranks (from a peer or a local worker): (code, reason, audited) if it must not reach
    it: it names an earlier start of the rank (dropped quietly: the normal aftermath of a restart), or acknowledges
    more than the rank sent on that channel (refused and audited); None if it may go on."""
    key = frame.key()
    reg = registry.at((key.account, key.job, key.src_rank))
    if reg is None:
        return None  # (held for the rank, if it comes back; a new start of it ignores it)
    if frame.meta.get("to", 0) != reg.inc:
        return "stale_ack", (f"acknowledgement for incarnation {frame.meta.get('to', 0)} of rank {reg.rank}, which is "
                             f"now incarnation {reg.inc}"), False
    why = reg.ack_refusal(frame.header.channel_id, frame.header.seq)
    return None if why is None else ("ack_beyond_sent", f"acknowledgement on channel {key.name!r} refused: {why}; a "
                                                        "receiver acknowledges only what it got", True)
