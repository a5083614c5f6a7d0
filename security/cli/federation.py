"""`nebula-admin federation status`: every site's links, RTT, bytes and messages moved since start, certificate, CA
and CRL expiry and last audit checkpoint in one table, from the sites' switch status files (or their metrics
endpoints); stale sites and disagreements between sites flagged."""
from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from security.federation_view import SiteView, disagreements, render, site_error, site_from_metrics, \
    site_from_status, to_json

STATUS_SUFFIX = ".status.json"  # what sites drop into --dir: <cluster>.status.json (a copy of their status.json)
MAX_BYTES = 4 << 20  # a status file or metrics page larger than this is not read (a site's file is not trusted)
FETCH_TIMEOUT_S = 5.0
STATUS_HELP = """\
Sources: --status NAME=PATH (a copy of site NAME's switch status.json, from STATE_DIR/status.json of its switch, or
the file itself on this host), --status NAME=http://HOST:PORT/metrics (its switch's Prometheus endpoint: links, RTT,
totals and certificate expiry, no checkpoint), and --dir DIR (every DIR/<cluster>.status.json). Exit 0 when every
site is current, every link up and no two sites disagree; 1 otherwise; 2 for a usage error.
"""


class _Usage(Exception):
    """A command-line mistake: one line naming it and the fix."""


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `federation` command."""
    p = sub.add_parser("federation", help="one view of the whole federation from its sites' status")
    s = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    st = s.add_parser("status", help="every site's links, RTT, bytes moved, expiry and last audit checkpoint",
                      formatter_class=argparse.RawDescriptionHelpFormatter, description=STATUS_HELP)
    st.add_argument("--status", action="append", default=[], metavar="NAME=SOURCE",
                    help="site NAME's status: a status.json path, or http://HOST:PORT/metrics of its switch; "
                         "repeatable")
    st.add_argument("--dir", action="append", default=[],
                    help="directory of status files the sites drop, named <cluster>.status.json; repeatable")
    st.add_argument("--stale-after", type=float, default=60.0, metavar="SECONDS",
                    help="mark a site stale when its status is older than this (default 60)")
    st.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    st.set_defaults(handler=status)


def _sources(args: argparse.Namespace) -> list[tuple[str, str]]:
    """(site name, path or URL) for every site given, in the order given; _Usage for a malformed argument."""
    out: dict[str, str] = {}
    for spec in args.status:
        name, sep, src = spec.partition("=")
        if not sep or not name.strip() or not src.strip():
            raise _Usage(f"--status {spec!r} is not NAME=SOURCE; give e.g. --status A=/srv/A/state/status.json "
                         "or --status A=http://127.0.0.1:9100/metrics")
        out[name.strip()] = src.strip()
    for d in args.dir:
        folder = Path(d)
        if not folder.is_dir():
            raise _Usage(f"--dir {d}: not a directory; give the directory the sites drop <cluster>.status.json into")
        for f in sorted(folder.glob("*" + STATUS_SUFFIX)):
            out.setdefault(f.name[:-len(STATUS_SUFFIX)], str(f))
    if not out:
        raise _Usage("no site given; pass --status NAME=PATH (repeatable) or --dir DIR of <cluster>.status.json")
    return list(out.items())


def _read(name: str, source: str, now: float, stale_after: float) -> SiteView:
    """One site's view from a file or a metrics URL; unreadable sources come back as a site with the reason."""
    if source.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(source, timeout=FETCH_TIMEOUT_S) as resp:  # noqa: S310 (the admin's URL)
                body = resp.read(MAX_BYTES + 1)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            return site_error(name, source, f"cannot fetch it ({exc}); is the switch running with metrics.listen "
                                            "reachable from here?")
        if len(body) > MAX_BYTES:
            return site_error(name, source, f"larger than {MAX_BYTES} bytes; not a switch's metrics")
        return site_from_metrics(name, source, body.decode("utf-8", "replace"), now)
    try:
        with open(source, "rb") as f:
            body = f.read(MAX_BYTES + 1)
    except OSError as exc:
        return site_error(name, source, f"{exc.strerror or exc}; copy the site's STATE_DIR/status.json there")
    if len(body) > MAX_BYTES:
        return site_error(name, source, f"larger than {MAX_BYTES} bytes; not a switch status")
    try:
        parsed = json.loads(body)
    except ValueError as exc:
        return site_error(name, source, f"not JSON ({exc})")
    return site_from_status(name, source, parsed, now, stale_after)


def status(args: argparse.Namespace) -> int:
    """Handler of `federation status`."""
    try:
        if not args.stale_after > 0:
            raise _Usage(f"--stale-after {args.stale_after} must be a positive number of seconds, e.g. 60")
        sources = _sources(args)
    except _Usage as exc:
        print(f"nebula-admin federation status: error: {exc}", file=sys.stderr)
        return 2
    now = time.time()
    sites = [_read(name, src, now, args.stale_after) for name, src in sources]
    flags = disagreements(sites)
    if args.json:
        print(json.dumps(to_json(sites, flags, now), indent=1))
    else:
        print(render(sites, flags, now))
    healthy = all(s.error is None and not s.stale and all(lk.up for lk in s.links) for s in sites)
    return 0 if healthy and not flags else 1
