"""Per-rank entry point that paddle.distributed.launch starts: runs the job's mode (`nebula.modes.run`) for one
cluster."""
from __future__ import annotations

import argparse
import ctypes
import logging
import os
import signal
import sys
from pathlib import Path

EXIT_PEER_LOST = 3  # a peer cluster stayed silent past peer_timeout_s: restart all clusters to resume
EXIT_CONFIG = 2  # the clusters disagree on something the job needs (checked before training): fix and restart
EXIT_SWITCH = 4  # this cluster's switch did not answer (not started, or another endpoint or key): start it, retry
EXIT_SUPERSEDED = 5  # a newer launch of this cluster took over (whole-job recovery): this older one must not restart


def die_with_launcher() -> None:
    """Exit when paddle.distributed.launch (our parent) dies, however it dies.

    The launcher starts each rank in its own session, so killing a cluster's launcher would otherwise leave its
    ranks training on as orphans that nobody watches and that peer clusters still see as alive.
    """
    if not sys.platform.startswith("linux"):
        return
    pr_set_pdeathsig = 1
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0) != 0:
        logging.getLogger("nebula.worker").warning("prctl(PR_SET_PDEATHSIG) failed: errno %d", ctypes.get_errno())
    if os.getppid() == 1:  # the launcher died before the signal was armed
        os._exit(1)


def _stop(code: int, line: str) -> int:
    """Stop this rank with one line saying why: left to the launcher, which prints it once (or printed here when
    the rank was not started by `nebula launch`), with the exit code (a supervisor restarts by it)."""
    from nebula.launch.departures import record_failure

    if not record_failure(line, code):
        print(line, file=sys.stderr, flush=True)
    return code


def main(argv: list[str] | None = None) -> int:
    """Parse --job/--cluster/--intra, train, and map a lost peer to a clean, explained exit."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--job", required=True)
    ap.add_argument("--cluster", required=True)
    ap.add_argument("--intra", action="store_true")
    args = ap.parse_args(argv)
    die_with_launcher()
    from nebula.launch.departures import record_rank

    record_rank()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from nebula.channel import ChannelError, SwitchRefused
    from nebula.config.schema import ConfigError
    from nebula.launch.preflight import load_for_cluster
    from nebula.launch.quiet import default_sigterm
    from nebula.modes import run
    from nebula.pipeline.links import PeerLost, PeerNeverCame
    from nebula.recovery.driver import RecoveryAbandoned, RecoverySuperseded

    default_sigterm()  # (paddle's handler printed a C++ traceback block when the launcher stopped the ranks)
    cfg = load_for_cluster(args.job, args.cluster, intra=args.intra)  # as the launcher loaded it: the same cut
    try:
        res = run(cfg, args.cluster, workdir=Path(args.job).resolve().parent)
    except RecoveryAbandoned as exc:  # the lost cluster did not come back within recovery_timeout_s
        return _stop(EXIT_PEER_LOST, f"nebula: peer cluster {exc.cluster} lost: {exc}")
    except RecoverySuperseded as exc:
        return _stop(EXIT_SUPERSEDED, f"nebula: cluster {args.cluster}: {exc}")
    except PeerLost as exc:
        return _stop(EXIT_PEER_LOST, f"nebula: {exc}" if isinstance(exc, PeerNeverCame)
                     else f"nebula: peer cluster {exc.cluster} lost: {exc}")
    except SwitchRefused as exc:  # at connect, before any training step: one line, the reason names the fix
        return _stop(EXIT_CONFIG, f"nebula: the switch of cluster {args.cluster} refused job {cfg.job!r}: {exc}")
    except ChannelError as exc:  # our switch is not there (not started yet, or another key or endpoint)
        return _stop(EXIT_SWITCH, f"nebula: cluster {args.cluster}: {exc}")
    except ConfigError as exc:  # found at start-up, before any training step (e.g. clusters built differently)
        return _stop(EXIT_CONFIG, f"nebula: {exc}")
    logging.getLogger("nebula.worker").info("cluster %s rank %d finished steps %d..%d", res.cluster, res.rank,
                                            res.start_step, res.end_step)
    return 0


if __name__ == "__main__":
    sys.exit(main())
