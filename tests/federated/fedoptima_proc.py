"""One FedOptima actor as a real process (the integration test starts a server and devices with it)."""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from nebula.channel import Endpoint
from nebula.federated.fedoptima.config import FedOptimaSpec
from nebula.federated.fedoptima.runtime import run_device, serve
from nebula.federated.fedoptima.split import DeviceInfo, measure_flops_per_s
from tests.federated.fedoptima_task import BlobsTask


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--role", choices=["server", "device"], required=True)
    ap.add_argument("--worker", required=True)
    ap.add_argument("--job", default="fo")
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--server", default="A/0")
    ap.add_argument("--devices", default="")
    ap.add_argument("--spec", default="{}")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    spec = FedOptimaSpec(**{k: tuple(v) if isinstance(v, list) else v for k, v in json.loads(a.spec).items()})
    task = BlobsTask()
    with Endpoint.connect(a.worker, job=a.job, rank=a.rank) as ep:
        if a.role == "server":
            devs = [(d.split("/")[0], int(d.split("/")[1])) for d in a.devices.split(",") if d]
            res = dataclasses.asdict(serve(ep, devs, task, spec))
        else:
            c, r = a.server.split("/")
            num = int(a.devices) if a.devices else 1
            res = run_device(ep, (c, int(r)), a.rank - 1, num, task, spec,
                             DeviceInfo(flops_per_s=measure_flops_per_s(slowdown=spec.slowdown_of(a.rank - 1)),
                                        bandwidth_bytes_per_s=spec.bandwidth_bytes_per_s))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f)
    print("RESULT " + json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
