"""One rank of the process-group tests (started by paddle.distributed.launch): MODE flaky | late | raw | whole |
starved, OUT."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


STARVED_GROUPS = 6


def main(mode: str, out: Path, late_s: float) -> None:
    import paddle
    import paddle.distributed as dist

    import socket

    from nebula.pipeline.groups import StoreBarrier, create_groups, job_store, store_port, tcp_sockets

    dist.init_parallel_env()
    rank = dist.get_rank()
    job_store()
    nodelay = [s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) for s in tcp_sockets(store_port())]
    calls: list[list[int]] = []
    logs: list[str] = []

    def flaky(ranks: list[int]):
        calls.append(ranks)
        if mode == "flaky" and rank == 1 and len(calls) == 1:  # this rank's first attempt fails, as gloo's can
            dist.new_group(ranks)  # keep the group ids in step with the other rank, then fail
            raise RuntimeError("gloo: connect timed out (injected)")
        return dist.new_group(ranks)

    if mode == "late" and rank == 1:
        time.sleep(late_s)  # arrives at the group rendezvous past gloo's 30 s timeout
    if mode == "starved":  # rank 1 runs 10 ms of every 110 while every group is created (gloo's own new_group)
        throttle = None
        if rank == 1:
            throttle = subprocess.Popen([sys.executable, str(Path(__file__).with_name("_throttle.py")),
                                         str(os.getpid()), "10", "100"])
        try:
            made = create_groups([[0, 1]] * STARVED_GROUPS, world=2, new_group=dist.new_group, attempts=1,
                                 log=logs.append, timeout_s=late_s)
        finally:
            if throttle is not None:
                throttle.send_signal(signal.SIGTERM)  # it resumes this process before it exits
                throttle.wait()
        group = made[-1]
        for g in made[:-1]:  # every group connects (the last one is checked below, as in the other modes)
            y = paddle.to_tensor([float(rank + 1)])
            dist.all_reduce(y, group=g)
            assert float(y.numpy()[0]) == 3.0, float(y.numpy()[0])
    elif mode == "whole":  # Paddle's new_group: a group of every rank is the job's own
        group, pair = create_groups([[0, 1], [1]], world=2, timeout_s=120)
        assert group is None and pair is not None, (group, pair)
    else:
        (group,) = create_groups([[0, 1]], world=2, new_group=flaky, log=logs.append, timeout_s=120)
    x = paddle.to_tensor([float(rank + 1)])
    dist.all_reduce(x, group=group)
    got, error = None, None
    if mode in ("late", "raw"):
        if rank == 0:
            time.sleep(late_s)  # the root is late to the scatter (waiting on its sender, say)
        if mode == "late":  # "raw": wait inside gloo, as the runtime did before
            StoreBarrier(job_store(), 2, 120).wait("test/scatter", "scatter")
        parts: list = []
        try:
            dist.scatter_object_list(parts, [["a"], ["b"]] if rank == 0 else None, src=0, group=group)
            got = parts[0]
        except Exception as exc:  # recorded for the test to check
            error = f"{type(exc).__name__}: {exc}"
    (out / f"rank{rank}.json").write_text(json.dumps({"sum": float(x.numpy()[0]), "calls": len(calls),
                                                      "logs": logs, "scattered": got, "error": error,
                                                      "nodelay": nodelay}))
    if mode != "raw":
        dist.barrier()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), float(sys.argv[3]) if len(sys.argv) > 3 else 0.0)
