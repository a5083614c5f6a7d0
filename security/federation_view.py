"""One view of a federation from its sites' switch status files (or their Prometheus endpoints): links up or down,
RTT, bytes and messages moved since start, certificate, CA and CRL expiry, the last audit checkpoint; stale sites
and disagreements between sites flagged. Pure functions: reading files and URLs is the caller's (`nebula-admin
federation status`, `nebula-switch status`).

A status file comes from a site, so nothing in it is trusted: every field is type-checked, a field of the wrong type
reads as absent, every string is made safe for a terminal, and a file that is not a status at all makes its site
"unreadable" with the reason, never an exception.
"""
from __future__ import annotations

__all__ = ["LinkView", "SiteView", "Totals", "disagreements", "format_age", "format_bytes", "render", "site_error",
           "site_from_metrics", "site_from_status", "to_json", "totals_from_metrics"]

import datetime as dt
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from security._text import duration, safe_text

TEXT_LIMIT = 400  # characters of one site-supplied string (a last error, a warning): its own line below the table
NAME_LIMIT = 64  # characters of a cluster name


@dataclass(frozen=True, slots=True)
class Totals:
    """Bytes and messages (frames) one switch moved on one link since it started; None where not known."""

    bytes_out: int | None = None
    bytes_in: int | None = None
    frames_out: int | None = None
    frames_in: int | None = None


NOTHING = Totals(0, 0, 0, 0)


@dataclass(frozen=True, slots=True)
class LinkView:
    """One site's link to one peer, as that site reports it."""

    peer: str
    up: bool | None
    rtt_ms: float | None
    totals: Totals
    last_error: str = ""

    def __post_init__(self) -> None:
        if not self.peer:
            raise ValueError("LinkView.peer must be a cluster name")
        if self.rtt_ms is not None and not (math.isfinite(self.rtt_ms) and self.rtt_ms >= 0):
            raise ValueError(f"LinkView.rtt_ms={self.rtt_ms!r} must be a non-negative number or None")


@dataclass(frozen=True, slots=True)
class SiteView:
    """What one site's status says, read at `now` from `source`; `error` set when it could not be read at all."""

    name: str
    source: str
    error: str | None = None
    cluster: str | None = None  # the cluster the status itself names
    written: float | None = None  # when the switch wrote it (its clock)
    age_s: float | None = None
    stale: bool = False
    started: float | None = None
    epoch: int | None = None
    links: tuple[LinkView, ...] = ()
    certificate_expires: str | None = None
    ca_expires: str | None = None
    crl_next_update: str | None = None
    expiry_warnings: tuple[str, ...] = ()
    checkpoint_seq: int | None = None
    checkpoint_time: float | None = None
    notes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("SiteView.name must be a site name")

    def link(self, peer: str) -> LinkView | None:
        """This site's link to `peer`, or None if it has none."""
        return next((lk for lk in self.links if lk.peer == peer), None)


def _num(v: Any) -> float | None:
    """`v` if it is a finite number (not a bool), else None."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def _count(v: Any) -> int | None:
    """`v` if it is a non-negative integer (not a bool), else None."""
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def _text(v: Any, limit: int = TEXT_LIMIT) -> str | None:
    """`v` made safe for a terminal if it is a string, else None."""
    return safe_text(v, limit) if isinstance(v, str) else None


def _iso(v: Any) -> str | None:
    """`v` if it is an ISO 8601 time, normalised to UTC with a Z suffix; else None."""
    if not isinstance(v, str) or len(v) > 64:
        return None
    try:
        t = dt.datetime.fromisoformat(v.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    t = t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)
    return t.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def site_error(name: str, source: str, error: str) -> SiteView:
    """A site whose status could not be read (`error` says why and what to do)."""
    return SiteView(name=safe_text(name, NAME_LIMIT), source=safe_text(source, TEXT_LIMIT),
                    error=safe_text(error, TEXT_LIMIT))


def site_from_status(name: str, source: str, status: Any, now: float, stale_after_s: float,
                     totals: Mapping[str, Totals] | None = None) -> SiteView:
    """The view of one site from its switch's status (the parsed `status.json`), read at `now`; older than
    `stale_after_s` marks it stale. `totals`: per-peer totals known otherwise (from the switch's metrics, where a
    peer not named has moved nothing), used where the status has none."""
    if not isinstance(status, dict):
        return site_error(name, source, "not a switch status (a JSON object is expected)")
    written = _num(status.get("time"))
    if written is None:
        return site_error(name, source, "not a switch status (no `time`)")
    age = now - written
    notes = []
    cluster = _text(status.get("cluster"), NAME_LIMIT)
    if cluster is not None and cluster != name:
        notes.append(f"the status of {name} names cluster {cluster}")
    links_in = status.get("links") if isinstance(status.get("links"), dict) else {}
    sessions = status.get("sessions") if isinstance(status.get("sessions"), dict) else {}
    links = []
    for peer, lk in sorted(links_in.items()):
        if not isinstance(peer, str) or not peer or not isinstance(lk, dict):
            continue
        sess = sessions.get(peer) if isinstance(sessions.get(peer), dict) else {}
        other = Totals() if totals is None else totals.get(peer, NOTHING)
        # since start: the link's own counters, then the metrics'; a session's bytes count only since it began
        t = Totals(bytes_out=_first(_count(lk.get("bytes_out")), other.bytes_out),
                   bytes_in=_first(_count(lk.get("bytes_in")), other.bytes_in, _count(sess.get("bytes_in"))),
                   frames_out=_first(_count(lk.get("frames_out")), other.frames_out),
                   frames_in=_first(_count(lk.get("frames_in")), other.frames_in))
        rtt = _num(lk.get("rtt_ms"))
        up = lk.get("up") if isinstance(lk.get("up"), bool) else None
        links.append(LinkView(peer=safe_text(peer, NAME_LIMIT), up=up,
                              rtt_ms=rtt if rtt is not None and rtt >= 0 else None, totals=t,
                              last_error=_text(lk.get("last_error")) or ""))
    warnings = status.get("expiry_warnings")
    cp = status.get("audit_checkpoint") if isinstance(status.get("audit_checkpoint"), dict) else {}
    epoch = _count(status.get("epoch"))
    return SiteView(
        name=safe_text(name, NAME_LIMIT), source=safe_text(source, TEXT_LIMIT), cluster=cluster, written=written,
        age_s=age, stale=age > stale_after_s, started=_num(status.get("started")), epoch=epoch,
        links=tuple(links), certificate_expires=_iso(status.get("certificate_expires")),
        ca_expires=_iso(status.get("ca_expires")), crl_next_update=_iso(status.get("crl_next_update")),
        expiry_warnings=tuple(t for t in (_text(w) for w in warnings) if t) if isinstance(warnings, list) else (),
        checkpoint_seq=_count(cp.get("seq")), checkpoint_time=_num(cp.get("time")), notes=tuple(notes))


def _first(*values: int | None) -> int | None:
    """The first of `values` that is not None."""
    return next((v for v in values if v is not None), None)


def _samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Prometheus text exposition as {sample name: [(labels, value)]} (finite values only); ValueError if it is not
    Prometheus text."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    try:
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                value = _num(s.value)
                if value is not None:
                    out.setdefault(s.name, []).append((dict(s.labels), value))
    except Exception as exc:  # (the parser raises ValueError, IndexError, ... on malformed text)
        raise ValueError(f"not Prometheus text ({type(exc).__name__})") from None
    return out


def _totals(samples: dict[str, list[tuple[dict[str, str], float]]]) -> dict[str, Totals]:
    acc: dict[str, dict[str, int]] = {}
    for kind in ("bytes", "frames"):
        for labels, value in samples.get(f"nebula_switch_{kind}_total", []):
            peer, direction = labels.get("peer"), labels.get("direction")
            if not peer or direction not in ("in", "out"):
                continue
            acc.setdefault(peer, dict.fromkeys(("bytes_out", "bytes_in", "frames_out", "frames_in"), 0))
            acc[peer][f"{kind}_{direction}"] += int(value)
    return {peer: Totals(**d) for peer, d in acc.items()}


def totals_from_metrics(text: str) -> dict[str, Totals]:
    """Per-peer totals since start from a switch's Prometheus text (nebula_switch_bytes and nebula_switch_frames,
    summed over lanes; a peer not named there has moved nothing); ValueError if `text` is not Prometheus text."""
    return _totals(_samples(text))


def site_from_metrics(name: str, source: str, text: str, now: float) -> SiteView:
    """The view of one site from its switch's Prometheus text, scraped at `now` (always fresh; it names no CA, CRL or
    checkpoint unless the switch exports their seconds left, and expiry only as seconds left, turned into times)."""
    try:
        samples = _samples(text)
    except ValueError as exc:
        return site_error(name, source, str(exc))
    if "nebula_switch_link_up" not in samples and "nebula_switch_bytes_total" not in samples:
        return site_error(name, source, "not a switch's metrics (no nebula_switch_link_up)")
    totals = _totals(samples)

    def by_peer(sample: str) -> dict[str, float]:
        return {lb["peer"]: v for lb, v in samples.get(sample, []) if lb.get("peer")}

    up, rtt = by_peer("nebula_switch_link_up"), by_peer("nebula_switch_rtt_seconds")
    links = tuple(LinkView(peer=safe_text(p, NAME_LIMIT), up=up[p] >= 1,
                           rtt_ms=round(rtt[p] * 1000, 3) if rtt.get(p, -1) > 0 else None,
                           totals=totals.get(p, NOTHING)) for p in sorted(up))

    def expiry(sample: str) -> str | None:
        got = samples.get(sample)
        if not got or abs(got[0][1]) > 1e11:
            return None
        return dt.datetime.fromtimestamp(now + got[0][1], dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")

    return SiteView(name=safe_text(name, NAME_LIMIT), source=safe_text(source, TEXT_LIMIT), written=now, age_s=0.0,
                    links=links, certificate_expires=expiry("nebula_switch_certificate_expiry_seconds"),
                    ca_expires=expiry("nebula_switch_ca_expiry_seconds"),
                    crl_next_update=expiry("nebula_switch_crl_expiry_seconds"))


def disagreements(sites: list[SiteView]) -> list[str]:
    """Where the sites' views differ: A's link to B up while B's to A is down; a site that has no link to another
    site read here (it lacks a peers update); a site linked to a cluster not among those read. Unreadable and stale
    sites are left out (their view is not current)."""
    live = {s.name: s for s in sites if s.error is None and not s.stale}
    read = {s.name for s in sites}
    out = []
    for a in sorted(live):
        for lk in live[a].links:
            if lk.peer not in read:
                out.append(f"{a} has a link to {lk.peer}, which is not among the sites read (removed from the "
                           f"federation? then apply the peers update that drops it at {a})")
        for b in sorted(live):
            if b == a:
                continue
            mine, theirs = live[a].link(b), live[b].link(a)
            if mine is None:
                out.append(f"{a} has no link to {b} while {b} is in the federation: apply the latest peers update "
                           f"at {a} (nebula-switch reload --update)")
            elif a < b and theirs is not None and mine.up is not None and theirs.up is not None \
                    and mine.up != theirs.up:
                up, down = (a, b) if mine.up else (b, a)
                out.append(f"{up} says its link to {down} is up, {down} says its link to {up} is down")
    return out


def format_bytes(n: int | None) -> str:
    """`n` bytes in B, KiB, MiB, GiB or TiB; `-` for None."""
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def format_age(seconds: float | None) -> str:
    """A duration as `45s`, `12m`, `3h05m`, `2d04h`; `-` for None."""
    return "-" if seconds is None else duration(seconds, minutes_only=True)


def _left(iso: str | None, now: float) -> str:
    """Time left until `iso` (`EXPIRED` once past); `-` if not known."""
    if iso is None:
        return "-"
    left = dt.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() - now
    return "EXPIRED" if left <= 0 else format_age(left)


def _site_state(s: SiteView) -> str:
    if s.error is not None:
        return "unreadable"
    return f"stale {format_age(s.age_s)}" if s.stale else "ok"


COLUMNS = ("site", "status", "uptime", "cert", "ca", "crl", "checkpoint", "peer", "link", "rtt ms", "sent",
           "received", "frames out", "frames in")


def _rows(sites: list[SiteView], now: float) -> list[list[str]]:
    rows = []
    for s in sites:
        cp = "-" if s.checkpoint_seq is None else (
            f"#{s.checkpoint_seq}" + ("" if s.checkpoint_time is None else f" {format_age(now - s.checkpoint_time)} ago"))
        head = [s.name, _site_state(s), format_age(None if s.started is None else now - s.started),
                _left(s.certificate_expires, now), _left(s.ca_expires, now), _left(s.crl_next_update, now), cp]
        if s.error is not None:
            head[2:] = ["-"] * 5
        links = s.links or (None,)
        for i, lk in enumerate(links):
            cells = head if i == 0 else [""] * len(head)
            if lk is None:
                rows.append(cells + ["-"] * 7)
                continue
            state = "-" if lk.up is None else ("up" if lk.up else "down")
            rtt = "-" if lk.rtt_ms is None else f"{lk.rtt_ms:.2f}"
            t = lk.totals
            rows.append(cells + [lk.peer, state, rtt, format_bytes(t.bytes_out), format_bytes(t.bytes_in),
                                 "-" if t.frames_out is None else str(t.frames_out),
                                 "-" if t.frames_in is None else str(t.frames_in)])
    return rows


def render(sites: list[SiteView], flags: list[str], now: float) -> str:
    """The federation as one table (a row per site and link), then each site's problems and the disagreements."""
    rows = _rows(sites, now)
    widths = [max([len(c)] + [len(r[i]) for r in rows]) for i, c in enumerate(COLUMNS)]
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(COLUMNS, widths)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
    problems = []
    for s in sites:
        if s.error is not None:
            problems.append(f"{s.name}: cannot read {s.source}: {s.error}")
            continue
        if s.stale:
            problems.append(f"{s.name}: status is {format_age(s.age_s)} old ({s.source}); is its switch running, "
                            f"and does the site still send its status file?")
        problems += [f"{s.name}: {w}" for w in s.expiry_warnings]
        problems += [f"{s.name}: {n}" for n in s.notes]
        problems += [f"{s.name}: link to {lk.peer} down: {lk.last_error}" for lk in s.links
                     if lk.up is False and lk.last_error]
    if problems:
        lines += ["", "problems:"] + [f"  {p}" for p in problems]
    if flags:
        lines += ["", "disagreements:"] + [f"  {f}" for f in flags]
    ok = sum(1 for s in sites if s.error is None and not s.stale)
    lines += ["", f"{len(sites)} site(s): {ok} current, {len(sites) - ok} stale or unreadable; "
                  f"{len(flags)} disagreement(s)"]
    return "\n".join(lines)


def to_json(sites: list[SiteView], flags: list[str], now: float) -> dict[str, Any]:
    """The same view as a JSON-ready dict."""
    def site(s: SiteView) -> dict[str, Any]:
        return {
            "name": s.name, "source": s.source, "error": s.error, "cluster": s.cluster, "written": s.written,
            "age_s": None if s.age_s is None else round(s.age_s, 3), "stale": s.stale, "started": s.started,
            "uptime_s": None if s.started is None else round(now - s.started, 3), "epoch": s.epoch,
            "certificate_expires": s.certificate_expires, "ca_expires": s.ca_expires,
            "crl_next_update": s.crl_next_update, "expiry_warnings": list(s.expiry_warnings),
            "audit_checkpoint": None if s.checkpoint_seq is None else {"seq": s.checkpoint_seq,
                                                                         "time": s.checkpoint_time},
            "notes": list(s.notes),
            "links": {lk.peer: {"up": lk.up, "rtt_ms": lk.rtt_ms, "bytes_out": lk.totals.bytes_out,
                                "bytes_in": lk.totals.bytes_in, "frames_out": lk.totals.frames_out,
                                "frames_in": lk.totals.frames_in, "last_error": lk.last_error} for lk in s.links},
        }
    return {"time": now, "sites": [site(s) for s in sites], "disagreements": list(flags)}
