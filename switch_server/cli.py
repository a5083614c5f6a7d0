"""`nebula-switch`: serve (run a switch server), reload (apply a changed config or a peers update to it, live),
status (links and throughput), probe (end-to-end link test)."""
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

from nebula.config import ConfigError
from nebula.config.switch import load_switch_config

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
    age = time.time() - st["time"]
    if args.json:
        print(json.dumps(st))
        return 0 if age < 10 else 1
    stale = f"  (STALE: last written {age:.0f} s ago; the switch is not running)" if age >= 10 else ""
    print(f"switch {st['cluster']} epoch {st['epoch']} pid {st['pid']}{stale}")
    print(f"  wan {st['wan']}  local {st['local']}  ipc {st.get('local_ipc') or '-'}  metrics {st['metrics'] or '-'}")
    print(f"  workers {st['workers']} ({st.get('shm_workers', 0)} with shared memory)  queued {st['queued_bytes']} B  certificate expires {st['certificate_expires']}")
    print(f"  {'peer':<12}{'state':<7}{'rtt ms':>9}{'out Mbit/s':>12}{'in Mbit/s':>11}{'queued B':>12}{'unacked B':>12}  last error")
    for c, link in sorted(st["links"].items()):
        sess = st["sessions"].get(c, {})
        rtt = "-" if link["rtt_ms"] is None else f"{link['rtt_ms']:.2f}"
        print(f"  {c:<12}{'up' if link['up'] else 'down':<7}{rtt:>9}{link['mbit_out']:>12.2f}"
              f"{sess.get('mbit_in', 0.0):>11.2f}{link['queued_bytes']:>12}{link['unacked_bytes']:>12}  {link['last_error']}")
    return 0 if age < 10 else 1


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
    s.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    s.set_defaults(func=_serve)
    r = sub.add_parser("reload", help="apply a changed switch.yaml, certificates and CRL (or a peers update) to the "
                                      "running switch, without a restart (what SIGHUP does), and report the outcome")
    r.add_argument("--config", required=True, help="switch.yaml of the running switch")
    r.add_argument("--update", help="a peers update from the federation's admin (<cluster>-r<N>.tar.gz): its peers "
                                    "and CRL are written into the kit first")
    r.add_argument("--timeout", type=float, default=15.0, help="seconds to wait for the switch's answer")
    r.set_defaults(func=_reload)
    st = sub.add_parser("status", help="print links and throughput of a running switch")
    st.add_argument("--config", required=True)
    st.add_argument("--json", action="store_true")
    st.set_defaults(func=_status)
    pr = sub.add_parser("probe", help="send or receive numbered test messages through the federation")
    pr.add_argument("--config", required=True, help="switch.yaml of this cluster (worker.yaml beside it is used)")
    pr.add_argument("--worker", help="worker.yaml to use instead of the one beside --config")
    mode = pr.add_mutually_exclusive_group(required=True)
    mode.add_argument("--recv", action="store_true")
    mode.add_argument("--send", action="store_true")
    pr.add_argument("--to", help="destination cluster (with --send)")
    pr.add_argument("--count", type=int, default=100,
                    help="messages to send; with --recv, to receive in all (each sender numbers its own from 0)")
    pr.add_argument("--bytes", type=int, default=65536)
    pr.add_argument("--job", default="probe")
    pr.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for each message")
    pr.set_defaults(func=_probe)
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of nebula-switch."""
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
