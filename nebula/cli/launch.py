"""`nebula launch job.yaml --cluster C`: start one cluster's ranks of a job (wraps paddle.distributed.launch)."""
from __future__ import annotations

import argparse
import sys

from nebula.config.schema import ConfigError


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the `launch` subcommand."""
    p = subparsers.add_parser("launch", help="start this cluster's ranks of a job",
                              description=__doc__)
    p.add_argument("job", help="job YAML file (the same file on every cluster)")
    p.add_argument("--cluster", required=True, help="id of the cluster this command starts")
    p.add_argument("--intra", action="store_true", help="run every stage inside this cluster (comparison mode)")
    p.add_argument("--node-rank", type=int, default=0, help="index of this node when the cluster has nodes > 1")
    p.add_argument("--log-dir", default=None, help="per-rank logs (default: <metrics.dir>/log/<cluster>)")
    p.add_argument("--check", action="store_true", help="validate the job and print the command, start nothing")
    p.add_argument("--elastic", action="store_true",
                   help="layer pipeline: when a rank leaves, relaunch with one rank fewer on a new allocation, "
                        "resuming from the last per-layer checkpoint")
    p.add_argument("--supervise", action="store_true",
                   help="launch the cluster again whenever it stops without finishing (killed, its switch gone, a "
                        "peer lost): with recovery_timeout_s in the job, the other clusters wait and resume with it")
    p.add_argument("--max-restarts", type=int, default=10,
                   help="with --supervise: give up after this many failed launches in a row (default 10)")


def run(args: argparse.Namespace) -> int:
    """Validate the job, then run the cluster's ranks; exit 2 on a bad config."""
    from nebula.launch import build_command, launch, prepare

    try:
        if args.check:
            cfg = prepare(args.job, args.cluster, intra=args.intra)
            print(" ".join(build_command(args.job, cfg, args.cluster, intra=args.intra, node_rank=args.node_rank,
                                         log_dir=args.log_dir)))
            return 0
        if args.supervise:
            from nebula.launch.supervise import supervise

            return supervise(args.job, args.cluster, max_restarts=args.max_restarts, node_rank=args.node_rank,
                             log_dir=args.log_dir, report=lambda line: print(line, file=sys.stderr, flush=True))
        if args.elastic:
            from nebula.launch.elastic import launch_elastic

            prepare(args.job, args.cluster)
            return launch_elastic(args.job, args.cluster)
        return launch(args.job, args.cluster, intra=args.intra, node_rank=args.node_rank, log_dir=args.log_dir,
                      report=lambda line: print(line, file=sys.stderr, flush=True))
    except ConfigError as exc:
        print(f"nebula launch: invalid job: {exc}", file=sys.stderr)
        return 2
