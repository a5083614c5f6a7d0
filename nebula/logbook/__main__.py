"""`python -m nebula.logbook METRICS_DIR LOGDIR`: VisualDL scalars of a run's metrics files, one run per cluster."""
from __future__ import annotations

import argparse
import sys

from nebula.logbook.scalars import scalars_note


def main(argv: list[str] | None = None) -> int:
    """Write the scalars and print where they are (exit 0 also when VisualDL is absent: the line says so)."""
    p = argparse.ArgumentParser(prog="python -m nebula.logbook", description=__doc__)
    p.add_argument("metrics_dir")
    p.add_argument("logdir")
    args = p.parse_args(argv)
    print(scalars_note(args.metrics_dir, args.logdir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
