"""Held-out accuracy of every global model in a federated job's trail, beside the central baseline; a plot.
`python -m recipes.federated.evaluate JOB --data D [--central central.json] [--plot accuracy.png]`."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from nebula.federated.config import load_federated_job
from nebula.federated.controller.trail import ModelTrail
from recipes.federated.data import load_prepared

__all__ = ["trail_accuracy"]


def trail_accuracy(job_file: str, data: str, hidden: int = 64) -> list[tuple[int, int, float]]:
    """(round, version, held-out accuracy) of every model in the job's trail."""
    import paddle

    from recipes.federated.central import test_accuracy
    from recipes.federated.model import LangIdModel

    job = load_federated_job(job_file)
    d = load_prepared(data)
    model = LangIdModel(num_langs=len(d["langs"]), hidden=hidden)
    out = []
    with ModelTrail(f"{job.controller.dir}/trail") as t:
        for m in t.models():
            w, _ = t.load(m.version)
            model.set_state_dict({k: paddle.to_tensor(v) for k, v in w.items()})
            out.append((m.round, m.version, test_accuracy(model, d)))
    return out


def main() -> None:
    """Print a table of accuracy per round (and the central baseline per epoch); write the plot."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("job")
    p.add_argument("--data", required=True)
    p.add_argument("--central", help="JSON list of the central baseline's accuracy per epoch")
    p.add_argument("--plot", help="PNG to write")
    args = p.parse_args()
    rows = trail_accuracy(args.job, args.data)
    central = json.load(open(args.central)) if args.central else []
    print(f"{'round':>5} {'version':>7} {'federated':>9} {'central':>8}")
    for r, v, a in rows:
        c = central[r - 1] if 1 <= r <= len(central) else None
        print(f"{r:>5} {v:>7} {a:>9.4f} {'-' if c is None else f'{c:.4f}':>8}")
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot([r for r, _, _ in rows], [a for _, _, a in rows], "o-", label="federated (non-IID clients)")
        if central:
            ax.plot(range(0, len(central) + 1), [rows[0][2]] + central, "s--", label="central (all data)")
        ax.set_xlabel("round (= epochs of all training data seen)")
        ax.set_ylabel("held-out accuracy")
        ax.set_title("language identification of gettext messages")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=100)
        print(f"plot written to {args.plot}")
        print(_scalars(args.job, rows, central, Path(args.plot).parent / "vdl"))


def _scalars(job_file: str, rows: list, central: list, logdir: Path) -> str:
    """VisualDL scalars beside the plot: held-out accuracy per round (and the central baseline's per epoch), the
    WAN bytes of each round; one line saying where, or why not."""
    from nebula.logbook import LogbookUnavailable, Scalar, write_scalars

    with ModelTrail(f"{load_federated_job(job_file).controller.dir}/trail") as t:
        wan = [Scalar("wan_bytes", r.round, float(r.detail.get("wan_bytes") or 0)) for r in t.rounds()]
    series = {"federated": [Scalar("accuracy", r, a) for r, _, a in rows] + wan}
    if central:
        series["central"] = [Scalar("accuracy", e + 1, a) for e, a in enumerate(central)]
    try:
        write_scalars(logdir, series)
    except LogbookUnavailable as exc:
        return f"VisualDL scalars not written: {exc}"
    return f"VisualDL scalars of {', '.join(series)}: {logdir} (visualdl --logdir {logdir})"


if __name__ == "__main__":
    main()
