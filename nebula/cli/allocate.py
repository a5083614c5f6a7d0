"""`nebula allocate --model M --devices devices.yaml [--method ...]`: print (or write into a job) an allocation."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the `allocate` subcommand."""
    from nebula.balance.base import method_names
    from nebula.balance.bert import PRESETS

    p = subparsers.add_parser("allocate", help="allocate a model's layers to devices", description=__doc__)
    p.add_argument("--model", required=True,
                   help=f"a preset ({', '.join(PRESETS)}), a profile YAML file (nebula.balance.profile), or a job "
                        "file whose recipe exposes its layers (profiled here on one micro-batch)")
    p.add_argument("--devices", required=True, help="devices.yaml (see nebula.balance.devices)")
    p.add_argument("--method", default="optimal", choices=method_names(), help="allocator (default: optimal)")
    p.add_argument("--batch", type=int, default=None, help="preset models: sequences per iteration")
    p.add_argument("--seq-len", type=int, default=None, help="preset models: tokens per sequence")
    p.add_argument("--write-job", metavar="JOB", default=None,
                   help="also write the allocation under `allocation:` in this job YAML file")


def run(args: argparse.Namespace) -> int:
    """Allocate and print the table; exit 2 on bad input or an allocation that cannot fit."""
    from nebula.balance import AllocationError
    from nebula.balance.report import allocate_model, format_table, write_allocation
    from nebula.config.schema import ConfigError

    try:
        changes = {k: v for k, v in (("batch", args.batch), ("seq_len", args.seq_len)) if v is not None}
        if _is_job_file(args.model):
            alloc, names = _allocate_job(args.model, args.devices, args.method)
        else:
            alloc, names = allocate_model(args.model, args.devices, args.method, **changes)
        print(format_table(alloc, names))
        if args.write_job:
            write_allocation(Path(args.write_job), alloc)
            print(f"wrote allocation to {args.write_job}")
    except (AllocationError, ConfigError, ValueError, OSError) as exc:
        print(f"nebula allocate: {exc}", file=sys.stderr)
        return 2
    return 0


def _is_job_file(path: str) -> bool:
    """True for a YAML file with a top-level `recipe:` (a job file, not a layer profile)."""
    from security._yaml import YamlError, read_yaml

    p = Path(path)
    if not p.is_file() or p.suffix not in (".yaml", ".yml"):
        return False
    try:
        doc = read_yaml(p)
    except YamlError:
        return False
    return isinstance(doc, dict) and "recipe" in doc


def _allocate_job(job: str, devices: str, method: str):
    """Profile the job's recipe layers and allocate them onto the devices."""
    from nebula.balance import allocate
    from nebula.balance.devices import load_devices
    from nebula.hybrid.costs import job_layer_profiles

    profiles = job_layer_profiles(job)
    return allocate([p.cost() for p in profiles], load_devices(devices), method), [p.name for p in profiles]
