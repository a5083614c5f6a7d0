"""What expires under a running switch (its certificate, the federation's CA, the CRL's next update) and the
warnings about it: one WARNING line when one enters its margin and again daily while it stays there, one ERROR line
once it has expired (new peer connections are refused from then on: TLS checks the CRL and certificates), a gauge of
seconds to each for Prometheus, and the lines the status file carries (`expiry_warnings`).

The margin is `tls.expiry_warning_days` of switch.yaml (default 7 days) for the certificate and the CA; for the CRL it
is at most a third of the CRL's lifetime, so that a CRL of a few days warns after the admin's daily `provision renew`
had its chances to refresh it, not from the moment it is written.
"""
from __future__ import annotations

__all__ = ["DEFAULT_WARNING_DAYS", "Expiry", "ExpiryWatch", "REPEAT_S", "expiries", "status_time", "upkeep_expiry",
           "warning_line", "watch_of"]

import datetime as dt
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509

from security.certbuild import SKEW

log = logging.getLogger("switch_server.server")

DEFAULT_WARNING_DAYS = 7.0
REPEAT_S = 86400.0  # a warning still true is said again after this long
CRL_FRACTION = 1 / 3  # the CRL warns when this fraction of its lifetime is left (at most the configured margin)
WHAT = ("certificate", "ca", "crl")


@dataclass(frozen=True, slots=True)
class Expiry:
    """One thing that expires: `what` (certificate, ca, crl), when (epoch seconds), its margin, its file."""

    what: str
    at: float
    margin_s: float
    path: str

    def __post_init__(self) -> None:
        if self.what not in WHAT:
            raise ValueError(f"expiry of {self.what!r}: expected one of {', '.join(WHAT)}")
        if not self.margin_s >= 0:
            raise ValueError(f"expiry margin {self.margin_s!r} must be >= 0 seconds")

    def state(self, now: float) -> str:
        """ok, warn (within the margin) or expired, as of `now`."""
        left = self.at - now
        return "expired" if left <= 0 else "warn" if left <= self.margin_s else "ok"


def status_time(t: float) -> str:
    """Epoch seconds as the status file writes times (like `certificate_expires`: `isoformat`, +00:00)."""
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).isoformat()


def expiries(cert_not_after: float, ca_not_after: float, crl_next: float | None, crl_last: float | None,
             warning_days: float, paths: dict[str, str]) -> list[Expiry]:
    """The three expiries with their margins (pure): the CRL's margin is the lesser of `warning_days` and a third
    of its lifetime (its last update is back-dated by SKEW for clock skew, which is no part of its lifetime)."""
    margin = warning_days * 86400.0
    out = [Expiry("certificate", cert_not_after, margin, paths.get("certificate", "")),
           Expiry("ca", ca_not_after, margin, paths.get("ca", ""))]
    if crl_next is not None:  # (a CRL without a next update never expires)
        life = crl_next - (crl_last if crl_last is not None else crl_next)
        if life > SKEW.total_seconds():
            life -= SKEW.total_seconds()
        out.append(Expiry("crl", crl_next, min(margin, max(0.0, life) * CRL_FRACTION), paths.get("crl", "")))
    return out


def warning_line(e: Expiry, now: float, cluster: str, config: str) -> str:
    """One line naming what expires (or expired) when, and the command that fixes it."""
    when = dt.datetime.fromtimestamp(e.at, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    left = e.at - now
    span = f"expired at {when}" if left <= 0 else f"expires at {when} (in {_span(left)})"
    update = f"`nebula-switch reload --config {config} --update {cluster}-rN.tar.gz`"
    if e.what == "crl":
        return (f"CRL {e.path} {span}: once past it every new peer connection is refused; apply the admin's latest "
                f"update ({update}; the admin writes them with `nebula-admin provision renew --out DIR`)")
    if e.what == "certificate":
        return (f"certificate {e.path} of switch {cluster} {span}: peers refuse it from then on; apply the admin's "
                f"update that renews it ({update}; `nebula-admin provision renew` renews it, or send a CSR made "
                f"with `nebula-switch csr --config {config} --out req.pem`)")
    return (f"CA certificate {e.path} {span}: every certificate of the federation stops with it; the admin makes "
            "a new CA and provisions new kits (`nebula-admin provision --from federation.yaml`)")


def _span(seconds: float) -> str:
    if seconds >= 86400:
        return f"{seconds / 86400:.1f} days"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds:.0f} s"


class ExpiryWatch:
    """The expiries of one switch, re-read when its files change, and the warnings already said."""

    def __init__(self) -> None:
        self._files: dict[str, tuple[float, Any]] = {}  # path -> (mtime, what was read)
        self._said: dict[str, tuple[str, float]] = {}  # what -> (state said, when)
        self.current: list[Expiry] = []

    def _read(self, path: str, load: Any) -> Any:
        try:
            m = os.stat(path).st_mtime
        except OSError:
            return self._files.get(path, (0.0, None))[1]
        held = self._files.get(path)
        if held is None or held[0] != m:
            try:
                value = load(Path(path).read_bytes())
            except (OSError, ValueError):
                value = held[1] if held else None
            held = self._files[path] = (m, value)
        return held[1]

    def refresh(self, cfg: Any, cert_not_after: float) -> list[Expiry]:
        """The expiries under switch config `cfg` now (its CA and CRL files, its certificate's `cert_not_after`)."""
        ca = self._read(cfg.tls.ca, x509.load_pem_x509_certificate)
        crl = self._read(cfg.tls.crl, x509.load_pem_x509_crl)
        nxt = crl.next_update_utc.timestamp() if crl is not None and crl.next_update_utc else None
        last = crl.last_update_utc.timestamp() if crl is not None else None
        days = getattr(cfg.tls, "expiry_warning_days", DEFAULT_WARNING_DAYS)
        self.current = expiries(cert_not_after, ca.not_valid_after_utc.timestamp() if ca is not None else 0.0, nxt,
                                last, days, {"certificate": cfg.tls.cert, "ca": cfg.tls.ca, "crl": cfg.tls.crl})
        return self.current

    def warnings(self, now: float, cluster: str, config: str) -> list[str]:
        """The lines of every expiry within its margin or past it (what the status file lists)."""
        return [warning_line(e, now, cluster, config) for e in self.current if e.state(now) != "ok"]

    def tick(self, now: float, cluster: str, config: str) -> list[tuple[int, str]]:
        """(log level, line) to log now: entering the margin (WARNING), expiring (ERROR), each again after
        REPEAT_S while it lasts, and back to ok (INFO, once renewed)."""
        out = []
        for e in self.current:
            state = e.state(now)
            said, when = self._said.get(e.what, ("ok", now))
            if state == said and (state == "ok" or now - when < REPEAT_S):
                continue
            self._said[e.what] = (state, now)
            if state == "ok":
                out.append((logging.INFO, f"{e.what} {e.path} renewed: valid until {status_time(e.at)}"))
            else:
                out.append((logging.ERROR if state == "expired" else logging.WARNING,
                            warning_line(e, now, cluster, config)))
        return out


def watch_of(server: Any) -> ExpiryWatch:
    """The ExpiryWatch of `server` (a SwitchServer), made on first use."""
    watch = getattr(server, "expiry_watch", None)
    if watch is None:
        watch = server.expiry_watch = ExpiryWatch()
    return watch


def upkeep_expiry(server: Any, now: float) -> None:
    """One tick of `server`'s expiry watch: re-read, the gauges, the log lines due."""
    watch = watch_of(server)
    for e in watch.refresh(server.cfg, server.trust.cert_not_after):
        server.metrics.expiry.labels(what=e.what).set(e.at - now)
    config = str(server.config_path or "switch.yaml")
    for level, line in watch.tick(now, server.cfg.cluster, config):
        log.log(level, "%s", line)
