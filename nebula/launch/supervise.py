"""`nebula launch --supervise`: launch a cluster's part of a job again whenever it stops without finishing.

With whole-job recovery on (`recovery_timeout_s`, docs/recovery.md) the other clusters wait at their step boundary
for a lost cluster to come back; the supervisor is what brings it back on this site, with no operator: when the
cluster's launch ends in failure (its ranks were killed, its host's switch was gone for a while, a peer stayed lost
past the bound) it is launched again, as it was, after a pause that doubles from `backoff_s` up to a minute, at
most `max_restarts` times in a row (a launch that ran ten minutes or more counts from zero again). It is not launched again when it
finished (exit 0), when the job is wrong (exit 2: fixing it needs a person) or when a newer launch of the cluster
took over (exit 5). A supervisor managed by the host (systemd with `Restart=on-failure`, a Kubernetes Job) does
the same for a whole host; this one needs nothing but the command.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Callable

from nebula.launch.departures import failure_codes
from nebula.launch.launcher import launch, log_dir_of, prepare
from nebula.launch.quiet import STOPPED_CODES

__all__ = ["supervise", "NO_RESTART", "should_restart"]

log = logging.getLogger(__name__)

EXIT_CONFIG, EXIT_SUPERSEDED = 2, 5
NO_RESTART = (EXIT_CONFIG, EXIT_SUPERSEDED)  # the ranks' own codes that a new launch cannot fix
MAX_BACKOFF_S = 60.0


def should_restart(code: int, rank_codes: set[int]) -> bool:
    """Whether a launch that ended with `code` (its ranks having recorded `rank_codes`) is launched again (not
    when it finished, when a rank's code says a new launch cannot help, nor when the operator stopped it)."""
    return code != 0 and code not in STOPPED_CODES and not (rank_codes & set(NO_RESTART))


def supervise(job_file: str | Path, cluster: str, *, max_restarts: int = 10, backoff_s: float = 2.0,
              node_rank: int = 0, log_dir: str | Path | None = None, report: Callable[[str], None] | None = None,
              run: Callable[[], int] | None = None, sleep: Callable[[float], None] = time.sleep) -> int:
    """Run `cluster`'s part of the job, launching it again after each failure (see the module); the last exit
    code. `run` (default `nebula.launch.launch`) starts one launch and returns its exit code."""
    if max_restarts < 0 or backoff_s < 0:
        raise ValueError(f"max_restarts={max_restarts} and backoff_s={backoff_s} must be >= 0")
    cfg = prepare(job_file, cluster)
    log_dir = Path(log_dir) if log_dir is not None else log_dir_of(cfg, cluster)
    rank_dir = log_dir.resolve() / "ranks"
    run = run or (lambda: launch(job_file, cluster, node_rank=node_rank, log_dir=log_dir, report=report))
    restarts, wait = 0, backoff_s
    while True:
        started = time.monotonic()
        code = run()
        if not should_restart(code, failure_codes(rank_dir)):
            return code
        if time.monotonic() - started > 10 * MAX_BACKOFF_S:  # it ran a good while: a new failure, not a loop
            restarts, wait = 0, backoff_s
        if restarts >= max_restarts:
            log.error("cluster %s: launch failed (exit %d) %d times in a row; not launching it again (raise "
                      "--max-restarts, or look at the ranks' logs under %s)", cluster, code, restarts + 1,
                      rank_dir.parent)
            return code
        restarts += 1
        log.warning("cluster %s: launch ended with exit %d; launching it again in %.0f s (restart %d of at most "
                    "%d)", cluster, code, wait, restarts, max_restarts)
        if report is not None:
            report(f"nebula launch: cluster {cluster} stopped (exit {code}); launching it again in {wait:.0f} s "
                   f"(restart {restarts} of at most {max_restarts})")
        try:
            sleep(wait)
        except KeyboardInterrupt:  # stopped between two launches: one line, as a launch stopped says
            if report is not None:
                report(f"nebula launch: cluster {cluster} stopped (SIGINT) before launching it again")
            return STOPPED_CODES[0]
        wait = min(wait * 2, MAX_BACKOFF_S)
