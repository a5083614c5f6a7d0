"""One cluster's recovery coordinator in its own process, standing in for a training runtime: agrees at launch,
then on `lost CLUSTER` (its runtime found a peer silent) or when asked by a peer, stops and agrees again; `timeout S`
sets the recovery timeout of the next recoveries. Prints one JSON line per agreement (and per timeout set); exits 3
with today's message when the recovery is abandoned.

Usage: python _driver.py WORKER_YAML JOB CLUSTERS(comma) STATE_DIR TIMEOUT_S STEPS(comma)"""
from __future__ import annotations

import json
import queue
import sys
import threading


def main(worker: str, job: str, clusters: str, state_dir: str, timeout_s: str, steps: str) -> int:
    from nebula.channel import Endpoint
    from nebula.recovery.driver import Coordinator, RecoveryAbandoned

    held = tuple(int(s) for s in steps.split(",") if s)
    ep = Endpoint.connect(worker, job=job, rank=0, timeout_s=60)
    coord = Coordinator(ep, job=job, clusters=clusters.split(","), timeout_s=float(timeout_s), state_dir=state_dir)
    commands: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [commands.put(line.strip()) for line in sys.stdin], daemon=True).start()

    def said(step: int) -> None:
        print(json.dumps({"step": step, "epoch": coord.round.epoch, "launch": coord.incarnation.count}), flush=True)

    wait = float(timeout_s)
    try:
        said(coord.start(held, timeout_s=120))
        while True:
            try:
                cmd = commands.get(timeout=0.1)
            except queue.Empty:
                cmd = ""
            if cmd.startswith("timeout "):
                wait = float(cmd.split()[1])
                print(json.dumps({"timeout": wait}), flush=True)
            elif cmd.startswith("lost "):
                said(coord.recover(held, lost=(cmd.split()[1],), timeout_s=wait))
            elif coord.pause_requested():
                said(coord.recover(held, timeout_s=wait))
    except RecoveryAbandoned as exc:
        print(f"nebula: peer cluster {exc.cluster} lost: {exc}", file=sys.stderr, flush=True)
        return 3
    finally:
        ep.close(flush_s=1)


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:7]))
