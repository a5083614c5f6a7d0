"""`nebula-switch`: serve (run a switch server), reload (apply a changed config or a peers update to it, live),
status (links: state, RTT, rates, totals since start; certificate, CA and CRL expiry), probe (end-to-end link test)."""
from __future__ import annotations

__all__ = ["build_parser", "main"]

import argparse
import asyncio
import faulthandler
import gc
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from nebula.config import ConfigError
from nebula.config.switch import load_switch_config
from switch_server.csr import add_csr_parser

if TYPE_CHECKING:
    from security.federation_view import SiteView

STOP_TIMEOUT_S = 5.0
EXIT_REVOKED = 3  # the switch's own certificate was revoked: it stopped, and a restart is refused alike


def _serve(args: argparse.Namespace) -> int:
    from switch_server.memtrim import keep_freed_memory
    from switch_server.server import SwitchError, SwitchServer

    keep_freed_memory()

    logging.basicConfig(level=getattr(logging, args.log_level.upper()), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # asyncio repeats "socket.send() raised exception" for every write racing a cut connection; links report it once
    logging.getLogger("asyncio").setLevel(logging.ERROR)
    from security.errors import SecurityError
    from security.preflight import check_switch_start

    try:
        cfg = load_switch_config(args.config)
        check_switch_start(cfg, args.config)  # fail closed: own certificate, CA, CRL, key file permissions
        server = SwitchServer(cfg, args.config)
    except (ConfigError, SwitchError, SecurityError) as exc:
        print(f"nebula-switch: {exc}", file=sys.stderr)
        return 2

    async def main() -> int:
        loop = asyncio.get_running_loop()
        try:
            wan, local = await server.start()
        except (SwitchError, OSError) as exc:
            print(f"nebula-switch: {exc}", file=sys.stderr)
            await server.stop()
            return 2
        stop = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        loop.add_signal_handler(signal.SIGINT, stop.set)
        loop.add_signal_handler(signal.SIGHUP, server.reload)
        faulthandler.register(signal.SIGUSR1)  # `kill -USR1 PID` prints every thread's stack to stderr
        # what start-up allocated lives as long as the server: keep it out of the cyclic collector, whose full
        # collections would otherwise walk it every few thousand frames and stall relaying for milliseconds
        gc.freeze()
        print(f"listening wan={wan} local={local}", flush=True)
        waits = [asyncio.create_task(stop.wait()), asyncio.create_task(server.must_stop.wait())]
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for w in waits:
            w.cancel()
        try:
            await asyncio.wait_for(server.stop(), STOP_TIMEOUT_S)
        except asyncio.TimeoutError:
            print(f"nebula-switch: did not stop cleanly within {STOP_TIMEOUT_S} s; exiting", file=sys.stderr)
            return 1
        return EXIT_REVOKED if server.fatal else 0

    return asyncio.run(main())


def _reload(args: argparse.Namespace) -> int:
    from switch_server.state import running_pid, state_dir
    from switch_server.status import status_path

    try:
        cfg = load_switch_config(args.config)
    except ConfigError as exc:
        print(f"nebula-switch reload: {exc} (the running switch was not asked and keeps its configuration)",
              file=sys.stderr)
        return 2
    if args.update:
        from switch_server.updates import take_update

        refused, said = take_update(cfg, Path(args.config), Path(args.update))
        if refused:
            print(f"nebula-switch reload: {said}", file=sys.stderr)
            return 2
        print(f"applied {args.update} to {args.config}: {said}", flush=True)
    pid = running_pid(state_dir(cfg))
    if pid is None:
        then = "it reads the update when it starts" if args.update else "nothing to reload"
        print(f"nebula-switch reload: switch {cfg.cluster} is not running (no process holds "
              f"{state_dir(cfg) / 'switch.pid'}); {then}: start it with `nebula-switch serve --config {args.config}`",
              file=sys.stderr)
        return 0 if args.update else 1
    path = status_path(cfg)
    before = _reload_count(path, pid)
    os.kill(pid, signal.SIGHUP)
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        count = _reload_count(path, pid)
        if count > before:
            status = json.loads(path.read_text())
            st, name = status["reload"], status.get("cluster", cfg.cluster)  # (the running switch's own name)
            if st["outcome"] == "ok":
                print(f"switch {name} (pid {pid}) reloaded {args.config}: peers "
                      f"{', '.join(st['peers']) or 'none'}; the CRL revokes {st['revoked']} certificate(s)")
                return 0
            print(f"nebula-switch reload: switch {name} (pid {pid}) refused the reload and keeps its running "
                  f"configuration: {st['reason']}", file=sys.stderr)
            return 1
        time.sleep(0.1)
    print(f"nebula-switch reload: switch {cfg.cluster} (pid {pid}) did not report a reload within {args.timeout} s; "
          f"see its log, or `nebula-switch status --config {args.config}`", file=sys.stderr)
    return 1


def _reload_count(path: Path, pid: int) -> int:
    """Reloads the switch `pid` has reported in its status file so far."""
    try:
        st = json.loads(path.read_text())
    except (OSError, ValueError):
        return 0
    return st.get("reload", {}).get("count", 0) if st.get("pid") == pid else 0


def _status(args: argparse.Namespace) -> int:
    from security.federation_view import site_from_status
    from switch_server.state import state_dir
    from switch_server.status import status_path

    try:
        cfg = load_switch_config(args.config)
    except ConfigError as exc:
        print(f"nebula-switch: {exc}", file=sys.stderr)
        return 2
    path = status_path(cfg)
    try:
        st = json.loads(path.read_text())
    except (OSError, ValueError):
        print(f"nebula-switch: no status at {path}; is the switch of cluster {cfg.cluster} running?", file=sys.stderr)
        return 1
    now = time.time()
    age = now - st["time"]
    fresh = age < STALE_AFTER_S
    # totals since start: the status file's own where it has them, else the switch's metrics endpoint (on this host)
    totals = _metrics_totals(st.get("metrics")) if fresh else None
    view = site_from_status(st.get("cluster", cfg.cluster), str(path), st, now, STALE_AFTER_S, totals)
    started = view.started if view.started is not None else _boot_time(state_dir(cfg) / "epoch", st)
    if args.json:
        st = dict(st, uptime_s=None if started is None else round(now - started, 3),
                  totals={lk.peer: {"bytes_out": lk.totals.bytes_out, "bytes_in": lk.totals.bytes_in,
                                    "frames_out": lk.totals.frames_out, "frames_in": lk.totals.frames_in}
                          for lk in view.links})
        print(json.dumps(st))
        return 0 if fresh else 1
    print(_status_text(st, view, started, now))
    return 0 if fresh else 1


STALE_AFTER_S = 10.0  # the switch rewrites its status every second: older than this, it is not running
METRICS_TIMEOUT_S = 2.0


def _metrics_totals(address: object) -> dict | None:
    """Per-peer totals since start from the switch's metrics endpoint `address` (host:port); None if it has none or
    cannot be reached (the table then shows what the status file holds)."""
    import urllib.request

    from security.federation_view import totals_from_metrics

    if not isinstance(address, str) or not address:
        return None
    host, _, port = address.rpartition(":")
    if host in ("0.0.0.0", "::", ""):  # (listening on every address: this host's loopback reaches it)
        host = "::1" if host == "::" else "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=METRICS_TIMEOUT_S) as resp:
            return totals_from_metrics(resp.read(8 << 20).decode("utf-8", "replace"))
    except (OSError, ValueError):
        return None


def _boot_time(epoch_file: Path, st: dict) -> float | None:
    """When the switch that wrote `st` started: its boot epoch file is written once at each start."""
    try:
        mtime = epoch_file.stat().st_mtime
    except OSError:
        return None
    return mtime if mtime <= st.get("time", 0) + 1 else None


def _status_text(st: dict, view: SiteView, started: float | None, now: float) -> str:
    """`nebula-switch status` as text: the switch, its expiry dates, then one row per link with rates and totals."""
    from security.federation_view import format_age, format_bytes

    age = now - st["time"]
    stale = f"  (STALE: last written {age:.0f} s ago; the switch is not running)" if age >= STALE_AFTER_S else ""
    since = "" if started is None else f"  up {format_age(now - started)} (since " \
        f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(started))})"
    out = [f"switch {st['cluster']} epoch {st['epoch']} pid {st['pid']}{since}{stale}",
           f"  wan {st['wan']}  local {st['local']}  ipc {st.get('local_ipc') or '-'}  metrics {st['metrics'] or '-'}",
           f"  workers {st['workers']} ({st.get('shm_workers', 0)} with shared memory)  queued {st['queued_bytes']} B"]
    expiry = [f"certificate expires {view.certificate_expires or st.get('certificate_expires', '-')}"]
    if view.ca_expires:
        expiry.append(f"CA expires {view.ca_expires}")
    if view.crl_next_update:
        expiry.append(f"CRL next update {view.crl_next_update}")
    if view.checkpoint_seq is not None:
        expiry.append(f"last audit checkpoint #{view.checkpoint_seq}")
    out.append("  " + "  ".join(expiry))
    out += [f"  WARNING: {w}" for w in view.expiry_warnings]
    out.append(f"  {'peer':<12}{'state':<6}{'rtt ms':>8}{'out Mbit/s':>11}{'in Mbit/s':>10}{'sent':>11}"
               f"{'received':>11}{'frames out':>11}{'frames in':>10}{'queued B':>10}{'unacked B':>10}  last error")
    links, sessions = st.get("links", {}), st.get("sessions", {})
    sums = [0, 0, 0, 0]
    for lk in view.links:
        raw, sess = links.get(lk.peer, {}), sessions.get(lk.peer, {})
        rtt = "-" if lk.rtt_ms is None else f"{lk.rtt_ms:.2f}"
        t = lk.totals
        for i, v in enumerate((t.bytes_out, t.bytes_in, t.frames_out, t.frames_in)):
            sums[i] += v or 0
        out.append(f"  {lk.peer:<12}{'up' if lk.up else 'down':<6}{rtt:>8}{raw.get('mbit_out', 0.0):>11.2f}"
                   f"{sess.get('mbit_in', 0.0):>10.2f}{format_bytes(t.bytes_out):>11}{format_bytes(t.bytes_in):>11}"
                   f"{_n(t.frames_out):>11}{_n(t.frames_in):>10}{raw.get('queued_bytes', 0):>10}"
                   f"{raw.get('unacked_bytes', 0):>10}  {lk.last_error}")
    if len(view.links) > 1:
        out.append(f"  {'total':<12}{'':<6}{'':>8}{'':>11}{'':>10}{format_bytes(sums[0]):>11}"
                   f"{format_bytes(sums[1]):>11}{sums[2]:>11}{sums[3]:>10}")
    return "\n".join(out)


def _n(v: int | None) -> str:
    """A count, or `-` where it is not known."""
    return "-" if v is None else str(v)


def _probe(args: argparse.Namespace) -> int:
    from switch_server.probe import ProbeError, probe_recv, probe_send

    try:
        if args.recv:
            result = probe_recv(args.worker or args.config, count=args.count, job=args.job, timeout_s=args.timeout)
        else:
            if not args.to:
                print("nebula-switch probe --send needs --to CLUSTER", file=sys.stderr)
                return 2
            result = probe_send(args.worker or args.config, to=args.to, count=args.count, size_bytes=args.bytes,
                                job=args.job, timeout_s=args.timeout)
    except (ProbeError, ConfigError) as exc:
        print(f"nebula-switch probe: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result), flush=True)
    return 0 if result.get("missing", 0) == 0 and result.get("duplicates", 0) == 0 and result.get("out_of_order", 0) == 0 else 1


def build_parser() -> argparse.ArgumentParser:
    """Argument parser of nebula-switch."""
    p = argparse.ArgumentParser(prog="nebula-switch", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="run the switch server of one cluster")
    s.add_argument("--config", required=True, help="switch.yaml (from nebula-admin provision)")
    s.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                   help="least severe log lines written to stderr (default info)")
    s.set_defaults(func=_serve)
    r = sub.add_parser("reload", help="apply a changed switch.yaml, certificates and CRL (or a peers update) to the "
                                      "running switch, without a restart (what SIGHUP does), and report the outcome")
    r.add_argument("--config", required=True, help="switch.yaml of the running switch")
    r.add_argument("--update", help="a peers update from the federation's admin (<cluster>-r<N>.tar.gz): its peers "
                                    "and CRL are written into the kit first")
    r.add_argument("--timeout", type=float, default=15.0, help="seconds to wait for the switch's answer")
    r.set_defaults(func=_reload)
    st = sub.add_parser("status", help="print a running switch's links: state, RTT, rates, and bytes and messages "
                                       "moved since it started; its certificate, CA and CRL expiry")
    st.add_argument("--config", required=True, help="switch.yaml of the switch (its state directory holds the status)")
    st.add_argument("--json", action="store_true",
                    help="print the status file as one JSON object, with uptime_s and per-peer totals added")
    st.set_defaults(func=_status)
    pr = sub.add_parser("probe", help="send or receive numbered test messages through the federation")
    pr.add_argument("--config", required=True, help="switch.yaml of this cluster (worker.yaml beside it is used)")
    pr.add_argument("--worker", help="worker.yaml to use instead of the one beside --config")
    mode = pr.add_mutually_exclusive_group(required=True)
    mode.add_argument("--recv", action="store_true", help="receive --count messages from the peers' senders, "
                                                          "then print what arrived (start it first)")
    mode.add_argument("--send", action="store_true", help="send --count messages to --to and wait for its receipt")
    pr.add_argument("--to", help="destination cluster (with --send)")
    pr.add_argument("--count", type=int, default=100,
                    help="messages to send; with --recv, to receive in all (each sender numbers its own from 0)")
    pr.add_argument("--bytes", type=int, default=65536, help="size of each message in bytes (with --send)")
    pr.add_argument("--job", default="probe", help="job name the probe's workers register as (the same at both ends)")
    pr.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for each message")
    pr.set_defaults(func=_probe)
    add_csr_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of nebula-switch."""
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
