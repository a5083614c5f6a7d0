"""`nebula fl start|status|rounds|models|stop JOB`: run and inspect a federated job (mode: federated); the job's
`algorithm:` picks FEDn rounds (default), FedOptima or OWL."""
from __future__ import annotations

import argparse
import json
import sys
import time

from nebula.config.schema import ConfigError

__all__ = ["add_parser", "run"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the `fl` subcommand and its actions."""
    p = subparsers.add_parser("fl", help="federated mode: start actors, inspect rounds and the model trail",
                              description=__doc__)
    sub = p.add_subparsers(dest="action", required=True)
    s = sub.add_parser("start", help="run this cluster's actors in the foreground")
    s.add_argument("job", help="federated job YAML (mode: federated)")
    s.add_argument("--cluster", required=True, help="id of this cluster")
    s.add_argument("--role", default="cluster", choices=["cluster", "controller", "combiner", "clients", "client"],
                   help="cluster: the combiner, plus the controller where the job puts it (default); controller or "
                        "combiner: that actor alone; clients: every client of the cluster in one process; client: "
                        "one client (--index); under algorithm fedoptima|owl the controller role is the server "
                        "and there is no combiner")
    s.add_argument("--index", type=int, default=0, help="client index inside the cluster (role client)")
    for name, text in (("status", "where the job stands"), ("rounds", "every round: valid or not, and why"),
                       ("stop", "ask the controller to stop after the round in progress")):
        q = sub.add_parser(name, help=text)
        q.add_argument("job", help="federated job YAML (mode: federated)")
        if name != "stop":
            q.add_argument("--json", action="store_true", help="machine-readable output")
    m = sub.add_parser("models", help="the model trail; --export writes one model")
    m.add_argument("job", help="federated job YAML (mode: federated)")
    m.add_argument("--json", action="store_true", help="machine-readable output")
    m.add_argument("--export", type=int, metavar="VERSION", help="write this model version")
    m.add_argument("--out", help="file for --export (.npz, or .pdparams to save with paddle)")


def run(args: argparse.Namespace) -> int:
    """Dispatch to the action; exit 2 on a bad job file or argument."""
    try:
        return _ACTIONS[args.action](args)
    except (ConfigError, ValueError, KeyError) as exc:
        print(f"nebula fl {args.action}: {exc}", file=sys.stderr)
        return 2


def _start(args: argparse.Namespace) -> int:
    from nebula.modes import start

    started = start(args.job, args.cluster, args.role, args.index)
    print(started.line, flush=True)
    return started.code


def _trail(job_file: str):
    from nebula.federated.config import load_federated_job
    from nebula.federated.controller.trail import ModelTrail

    job = load_federated_job(job_file)
    return job, ModelTrail(f"{job.controller.dir}/trail"), job.algorithm


def _status(args: argparse.Namespace) -> int:
    from nebula.federated.runfiles import RunFiles

    job, trail, algorithm = _trail(args.job)
    with trail:
        doc = RunFiles(job.controller.dir).read_status() or {"job": job.job, "state": "not started"}
        doc.setdefault("algorithm", algorithm)
        head = trail.head()
        doc["head"] = None if head is None else {"version": head.version, "round": head.round,
                                                 "metrics": head.metrics}
    if args.json:
        print(json.dumps(doc))
    else:
        age = f", updated {time.time() - doc['updated']:.0f} s ago" if "updated" in doc else ""
        of = "" if algorithm != "rounds" else f" of {job.rounds}"
        print(f"job {doc['job']} ({algorithm}): {doc['state']}, round {doc.get('round', 0)}{of}{age}")
        if doc.get("reason"):
            print(f"reason: {doc['reason']}")
        if doc.get("privacy"):
            print(_privacy_line(doc["privacy"]))
        if doc.get("result"):
            print(f"result: {json.dumps(doc['result'])}")
        if doc["head"]:
            print(f"head: version {doc['head']['version']} (round {doc['head']['round']}) {doc['head']['metrics']}")
    return 0


def _privacy_line(p: dict) -> str:
    """One line of where a job's privacy budget stands."""
    eps = "inf" if p.get("epsilon") is None else f"{p['epsilon']:.4f}"
    target = "" if p.get("target_epsilon") is None else f", target {p['target_epsilon']:g}"
    return (f"privacy: epsilon {eps} at delta {p['delta']:g} after {p['rounds']} rounds ({p['mode']} DP, "
            f"noise multiplier {p['noise_multiplier']:g}, sampling rate {p['sampling_rate']:g}, "
            f"{p['accountant']}{target})")


def _rounds(args: argparse.Namespace) -> int:
    _, trail, _ = _trail(args.job)
    with trail:
        rows = trail.rounds()
    if args.json:
        print(json.dumps([{f: getattr(r, f) for f in r.__slots__} for r in rows]))
        return 0
    private = any("privacy" in r.detail for r in rows)
    print(f"{'round':>5} {'status':8} {'version':>7} {'updates':>7} {'examples':>8} {'seconds':>8} {'accuracy':>8}  "
          + (f"{'epsilon':>8}  " if private else "") + "rejected / why")
    for r in rows:
        acc = r.detail.get("parent_accuracy")
        why = "; ".join(f"{x['client']}: {x['reason']}" for x in r.rejected) or (r.detail.get("why") or "")
        eps = (r.detail.get("privacy") or {}).get("epsilon")
        eps = f"{'-' if eps is None else f'{eps:.4f}':>8}  " if private else ""
        print(f"{r.round:>5} {r.status:8} {r.version or '-':>7} {r.num_updates:>7} {r.num_examples:>8} "
              f"{r.duration_s:>8.2f} {'-' if acc is None else f'{acc:.3f}':>8}  {eps}{why}")
    return 0


def _models(args: argparse.Namespace) -> int:
    _, trail, _ = _trail(args.job)
    with trail:
        if args.export is not None:
            if not args.out:
                raise ValueError("--export needs --out FILE (.npz or .pdparams)")
            print(f"model version {args.export} written to {trail.export(args.export, args.out)}")
            return 0
        rows = trail.models()
    if args.json:
        print(json.dumps([{f: getattr(m, f) for f in m.__slots__} for m in rows]))
        return 0
    print(f"{'version':>7} {'parent':>6} {'round':>5} {'strategy':10} {'clients':>7} {'bytes':>9}  metrics")
    for m in rows:
        print(f"{m.version:>7} {m.parent or '-':>6} {m.round:>5} {m.strategy.get('name', '?'):10} {len(m.clients):>7} "
              f"{m.num_bytes:>9}  {json.dumps(m.metrics)}")
    return 0


def _stop(args: argparse.Namespace) -> int:
    from nebula.federated.config import load_federated_job
    from nebula.federated.runfiles import RunFiles

    job = load_federated_job(args.job)
    RunFiles(job.controller.dir).ask_stop()
    print(f"asked the controller of {job.job} to stop after the round in progress")
    return 0


_ACTIONS = {"start": _start, "status": _status, "rounds": _rounds, "models": _models, "stop": _stop}
