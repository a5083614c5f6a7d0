"""Per-rank entry point of `nebula bench` (started by paddle.distributed.launch): probe, gather, rank 0 writes."""
from __future__ import annotations

import argparse
import logging
import os
import sys


def main(argv: list[str] | None = None) -> int:
    """Run the device benchmark on this rank; rank 0 writes the profiles file."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--job", required=True)
    ap.add_argument("--cluster", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    from nebula.launch.worker import die_with_launcher

    die_with_launcher()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import paddle
    import paddle.distributed as dist

    from nebula.config.job import load_job_config
    from nebula.hybrid.bench import write_profiles
    from nebula.hybrid.probe import probe_ranks

    cfg = load_job_config(args.job)
    spec = cfg.cluster(args.cluster)
    rank, world = int(os.environ.get("PADDLE_TRAINER_ID", "0")), int(os.environ.get("PADDLE_TRAINERS_NUM", "1"))
    if spec.device == "cpu":
        paddle.set_device("cpu")
    else:
        paddle.set_device(f"{spec.device}:{dist.ParallelEnv().device_id}")
    if world > 1:
        dist.init_parallel_env()
    slow = spec.pipeline.slowdown[rank] if spec.pipeline is not None and spec.pipeline.slowdown else 1.0
    probes = probe_ranks(rank=rank, world=world, device=spec.device, slowdown=slow)
    if rank == 0:
        path = write_profiles(args.out, args.cluster, spec.device, [p.to_dict() for p in probes])
        logging.getLogger("nebula.bench").info("cluster %s: %d rank(s) benchmarked, profiles in %s", args.cluster,
                                               world, path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
