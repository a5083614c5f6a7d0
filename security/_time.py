"""Times: parsing those given on the command line (ISO 8601 or a duration such as 30m, 12h, 7d), and grant lifecycles."""
from __future__ import annotations

import datetime as dt
import re

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def utcnow() -> dt.datetime:
    """Current time, timezone-aware UTC."""
    return dt.datetime.now(dt.timezone.utc)


def parse_time(text: str, *, direction: int, what: str) -> dt.datetime:
    """ISO 8601 (naive = UTC) or a duration from now, added (`direction=1`) or subtracted (`direction=-1`)."""
    m = _DURATION.match(text.strip())
    if m:
        return utcnow() + direction * dt.timedelta(seconds=float(m.group(1)) * _UNITS[m.group(2)])
    try:
        t = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{what} {text!r} is not a time; use ISO 8601 (2026-12-01T12:00:00Z) "
                         "or a duration such as 30m, 12h, 7d") from None
    return t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)


def iso(t: dt.datetime | float) -> str:
    """UTC ISO 8601 with a Z suffix, to the second."""
    if not isinstance(t, dt.datetime):
        t = dt.datetime.fromtimestamp(t, dt.timezone.utc)
    return t.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def lifecycle_status(revoked: str | None, expires: str | None) -> str:
    """active, expired or revoked (as of now) of something with ISO revocation and expiry times (grants)."""
    if revoked:
        return "revoked"
    if expires is not None and expires <= iso(utcnow()):
        return "expired"
    return "active"


class Lifecycle:
    """Mixin for a grant record with ISO `revoked` and `expires` fields: its `status`."""

    __slots__ = ()
    revoked: str | None
    expires: str | None

    @property
    def status(self) -> str:
        """active, expired or revoked (as of now)."""
        return lifecycle_status(self.revoked, self.expires)
