"""The federated part of the soak (benchmarks/soak.py): two clusters over the fault harness's WAN (delay, and loss
where namespaces run), toy clients each in a process of its own, 30% of them killed (SIGKILL) and started again at
the start of every round. Read back from the model trail: rounds valid, updates averaged twice (a client named
twice in a model, or more updates counted than clients named), the slowest round against its deadline."""
from __future__ import annotations

import contextlib
import os
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

from nebula.federated.controller.trail import ModelTrail
from testbed.faults import FaultyWan
from testbed.fedjob import write_job

CLIENTS = {"A": 5, "B": 5}
DEADLINE_S = 8.0
CHURN = 0.3


def _rounds(trail: Path) -> list:
    if not (trail / "trail.db").exists():
        return []
    with ModelTrail(trail) as t:
        return t.rounds()


def federated_churn(root: Path, procs: Any, rounds: int, namespaces: bool, seed: int = 0) -> dict:
    """Run `rounds` rounds with churn; the federated rows of the table."""
    root.mkdir(parents=True)
    rng = random.Random(seed)
    wan = FaultyWan(root / "wan", list(CLIENTS), procs, delay_ms=40, jitter_ms=10,
                    loss_per_mille=5 if namespaces else 0, name="soakfl", namespaces=namespaces)
    try:
        job = write_job(root, wan.workers(), CLIENTS, rounds=rounds, deadline_s=DEADLINE_S,
                        validity={"min_updates": 1}, startup_timeout_s=120)

        def start(role: str, cluster: str, *extra: str) -> Any:
            return procs.start([*wan.prefix(cluster), sys.executable, "-m", "nebula.federated.run", role, str(job),
                                "--cluster", cluster, *extra], stdout=open(root / f"{role}-{cluster}.log", "a"))

        actors = [start("cluster", c) for c in CLIENTS]
        clients = {(c, i): start("client", c, "--index", str(i)) for c, n in CLIENTS.items() for i in range(n)}
        trail, seen, restarts = root / "fl" / "trail", 0, 0
        deadline = time.monotonic() + rounds * (DEADLINE_S + 30) + 300
        while actors[0].poll() is None and time.monotonic() < deadline:
            n = len(_rounds(trail))
            if n > seen:  # a round closed, the next one starts: 30% leave now and join again
                seen = n
                for key in rng.sample(sorted(clients), max(1, round(CHURN * len(clients)))):
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(clients[key].pid, signal.SIGKILL)
                    clients[key].wait(10)
                    clients[key] = start("client", key[0], "--index", str(key[1]))
                    restarts += 1
            time.sleep(0.2)
        if actors[0].poll() is None:
            raise RuntimeError(f"the federated controller did not finish {rounds} rounds; see {root}/cluster-A.log")
        with ModelTrail(trail) as t:
            rs, models = t.rounds(), t.models()
        twice = sum(len(m.clients) - len(set(m.clients)) for m in models)
        twice += sum(max(0, r.num_updates - len(set(m.clients))) for r in rs for m in models if m.version == r.version)
        return {"clients": sum(CLIENTS.values()), "churn": f"{CHURN:.0%}", "rounds": len(rs),
                "valid": sum(r.status == "valid" for r in rs), "twice": twice,
                "slowest_s": max((r.duration_s for r in rs), default=0.0), "deadline_s": DEADLINE_S,
                "restarts": restarts, "exit": actors[0].returncode}
    finally:
        wan.close()
