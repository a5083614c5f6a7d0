"""`nebula plan JOB --link RATE,RTT`: every cross-cluster mode predicted for this job on this link, and the pick.

Step times come from the benchmark's measured table (benchmarks/wan_quality.py --json) scaled to the job's model
and batch; quality costs are the table's measured held-out losses relative to one cluster (see nebula.plan.table).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

DEFAULT_TABLE = Path(__file__).resolve().parent.parent / "plan" / "measured.json"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the `plan` subcommand."""
    p = subparsers.add_parser("plan", help="pick the cross-cluster mode for a job on a WAN link",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("job", metavar="JOB", help="the job YAML file (its recipe sizes the model, train.global_batch "
                                              "and the recipe's seq_len the step)")
    p.add_argument("--link", required=True, metavar="RATE,RTT",
                   help="the WAN between the clusters: rate in gbit/mbit/kbit and round trip in ms or s, "
                        "e.g. 100mbit,20ms")
    p.add_argument("--table", metavar="ROWS.json", default=str(DEFAULT_TABLE),
                   help="the benchmark's measured rows, from `python benchmarks/wan_quality.py --json FILE` "
                        f"(default: {DEFAULT_TABLE.name} shipped in nebula/plan)")
    p.add_argument("--quality-tolerance", metavar="FRACTION", type=float, default=0.02,
                   help="largest held-out loss above the one-cluster baseline's a recommended mode may have, as a "
                        "fraction (default 0.02 = 2%%)")
    p.add_argument("--compute-s", metavar="S", type=float, default=None,
                   help="your measured compute seconds of one step of this job in one cluster (default: the "
                        "table's compute per token scaled by the job's parameters)")


def run(args: argparse.Namespace) -> int:
    """Print the plan; one line on stderr and exit 2 on bad input."""
    try:
        print(_plan(args))
    except ValueError as exc:  # ConfigError and FormersError are ValueErrors
        print(f"nebula plan: {exc}", file=sys.stderr)
        return 2
    return 0


def _plan(args: argparse.Namespace) -> str:
    from nebula.config.job import load_job_config
    from nebula.config.schema import ConfigError
    from nebula.plan.link import parse_link
    from nebula.plan.sizing import size_job
    from nebula.plan.table import format_plan, load_table, make_plan

    link = parse_link(args.link)
    if args.quality_tolerance < 0:
        raise ValueError(f"--quality-tolerance {args.quality_tolerance:g} must be >= 0 (0.02 = 2% above the "
                         "one-cluster held-out loss)")
    if args.compute_s is not None and not args.compute_s > 0:
        raise ValueError(f"--compute-s {args.compute_s:g} must be > 0 seconds (or leave it out)")
    table = load_table(args.table)
    job = Path(args.job)
    if not job.is_file():
        raise ValueError(f"no job file at {job}; pass the job YAML the clusters launch with")
    try:
        cfg = load_job_config(job)
    except ConfigError as exc:
        if "missing required key clusters" in str(exc):
            raise ValueError(f"{job} lists no clusters; add the clusters the job spans under `clusters:` (e.g. "
                             "`- {id: A}` and `- {id: B}`) so there is a WAN to plan for") from None
        raise
    size = size_job(cfg, job)
    plan = make_plan(table, link, size, tolerance=args.quality_tolerance, compute_s=args.compute_s)
    where = f"job {cfg.job} ({job}, {len(cfg.clusters)} clusters)"
    return format_plan(plan, table, size, job=where, recipe=cfg.recipe.factory, compute_s=args.compute_s)
