"""Per-rank entry point that paddle.distributed.launch starts: runs `nebula.pipeline.run` for one cluster."""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

EXIT_PEER_LOST = 3  # a peer cluster stayed silent past peer_timeout_s: restart all clusters to resume


def main(argv: list[str] | None = None) -> int:
    """Parse --job/--cluster/--intra, train, and map a lost peer to a clean, explained exit."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--job", required=True)
    ap.add_argument("--cluster", required=True)
    ap.add_argument("--intra", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from nebula.config.job import load_job_config
    from nebula.pipeline import PeerLost
    from nebula.pipeline.runtime import run

    cfg = load_job_config(args.job)
    if args.intra:
        cfg = cfg.intra(args.cluster)
    try:
        res = run(cfg, args.cluster, workdir=Path(args.job).resolve().parent)
    except PeerLost as exc:
        logging.getLogger("nebula.worker").error("%s", exc)
        print(f"nebula: peer cluster {exc.cluster} lost: {exc}", file=sys.stderr, flush=True)
        return EXIT_PEER_LOST
    logging.getLogger("nebula.worker").info("cluster %s rank %d finished steps %d..%d", res.cluster, res.rank,
                                            res.start_step, res.end_step)
    return 0


if __name__ == "__main__":
    sys.exit(main())
