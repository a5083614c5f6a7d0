"""`nebula bench job.yaml --cluster C --out profiles.yaml`: benchmark a cluster's ranks (compute, memory, links)."""
from __future__ import annotations

import argparse
import sys

from nebula.config.schema import ConfigError


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the `bench` subcommand."""
    p = subparsers.add_parser("bench", help="device benchmark of one cluster's ranks, written as profiles YAML",
                              description=__doc__)
    p.add_argument("job", help="job YAML file")
    p.add_argument("--cluster", required=True, help="id of the cluster to benchmark")
    p.add_argument("--out", required=True, help="profiles file to write (YAML)")


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; print where the profiles are."""
    from nebula.hybrid.bench import read_profiles
    from nebula.launch.bench import bench_cluster

    try:
        code = bench_cluster(args.job, args.cluster, args.out)
    except ConfigError as exc:
        print(f"nebula bench: invalid job: {exc}", file=sys.stderr)
        return 2
    if code != 0:
        print(f"nebula bench: the cluster's ranks failed (exit {code}); see their logs", file=sys.stderr)
        return code
    doc = read_profiles(args.out)
    print(f"{'rank':>4} {'compute ms':>10} {'s/FLOP':>10} {'free MiB':>9} {'latency us':>10} {'MB/s':>9}")
    for r in doc["ranks"]:
        bw = r["bandwidth_bytes_per_s"]
        print(f"{r['rank']:>4} {r['compute_s'] * 1e3:>10.3f} {r['compute_s'] / r['probe_flops']:>10.3g} "
              f"{r['free_memory_bytes'] / 2**20:>9.0f} {r['latency_s'] * 1e6:>10.1f} "
              f"{bw / 1e6:>9.1f}")
    print(f"profiles of cluster {doc['cluster']} written to {args.out}")
    return 0
