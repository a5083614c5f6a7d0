"""One OWL actor as a real process (the integration test starts a server and workers with it)."""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from nebula.channel import Endpoint
from nebula.federated.owl.config import OwlSpec
from nebula.federated.owl.runtime import run_owl_worker, serve_owl
from tests.federated.fedoptima_task import TowersTask


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--role", choices=["server", "worker"], required=True)
    ap.add_argument("--worker", required=True)
    ap.add_argument("--job", default="owl")
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--server", default="A/0")
    ap.add_argument("--workers", default="")
    ap.add_argument("--spec", default="{}")
    a = ap.parse_args()
    spec = OwlSpec(**json.loads(a.spec))
    task = TowersTask()
    with Endpoint.connect(a.worker, job=a.job, rank=a.rank) as ep:
        if a.role == "server":
            ws = [(w.split("/")[0], int(w.split("/")[1])) for w in a.workers.split(",") if w]
            res = dataclasses.asdict(serve_owl(ep, ws, task, spec))
        else:
            c, r = a.server.split("/")
            res = run_owl_worker(ep, (c, int(r)), task, spec)
    print("RESULT " + json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
