"""Summary of an ELECTRA run: losses, RTD / CLM accuracy per language, WAN bytes per step, the Figure 8 plot.

`python -m recipes.electra.summary RUN` reads RUN/metrics (inter-cluster) and RUN/metrics_intra (intra-cluster,
if present), prints the summary, writes RUN/summary.json and RUN/loss.png; `python -m recipes.electra.summary RUN ""
D` the discriminator's side alone (what its site holds: launch_discriminator.sh prints it at its end). `python -m recipes.electra.summary
--progress METRICS.jsonl STEP,STEP,...` prints what the discriminator had learned in the 100 steps before each step.
"""
from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

from nebula.logbook import scalars_note

__all__ = ["summarise", "per_language", "progress", "wan_bytes_per_step", "plot", "main"]


def _read(path: Path) -> list[dict]:
    from nebula.pipeline import read_metrics

    return read_metrics(path) if path.is_file() else []


def per_language(records: list[dict]) -> dict[str, dict[str, float]]:
    """RTD accuracy, recall of replaced tokens and CLM accuracy per language key over `records` (summed counts)."""
    tot: dict[str, float] = defaultdict(float)
    for r in records:
        for k, v in r.items():
            if "/" in k and k.split("/")[0] in ("rtd_ok", "n", "clm_ok", "rep_n", "rep_ok"):
                tot[k] += v
    out = {}
    for key in sorted({k.split("/", 1)[1] for k in tot}):
        n = tot[f"n/{key}"]
        if n:
            out[key] = {"rtd_acc": tot[f"rtd_ok/{key}"] / n, "clm_acc": tot[f"clm_ok/{key}"] / n,
                        "replaced_recall": tot[f"rep_ok/{key}"] / max(tot[f"rep_n/{key}"], 1.0), "tokens": n}
    return out


def progress(records: list[dict], ends: list[int], window: int = 100) -> list[dict]:
    """RTD loss, replaced-token recall and CLM accuracy (means over language keys, monolingual and TRTD pairs apart)
    in the `window` steps before each step of `ends` that the records reach."""
    out = []
    for end in ends:
        w = [r for r in records if end - window <= r["step"] < end]
        if not w:
            continue
        pl = per_language(w)
        row: dict = {"steps": (end - window, end - 1), "rtd_loss": sum(r["rtd_loss"] for r in w) / len(w)}
        for part, keys in (("mono", [k for k in pl if not k.startswith("en-")]),
                           ("pairs", [k for k in pl if k.startswith("en-")])):
            for f in ("replaced_recall", "clm_acc"):
                row[f"{f}_{part}"] = sum(pl[k][f] for k in keys) / len(keys) if keys else None
        out.append(row)
    return out


def wan_bytes_per_step(run: Path, clusters: list[str]) -> float:
    """Mean bytes that left every cluster through its switch per step (all ranks), i.e. what crossed the WAN."""
    steps: dict[int, float] = defaultdict(float)
    for c in clusters:
        for f in sorted((run / "metrics").glob(f"{c}.rank*.jsonl")):
            for r in _read(f):
                steps[r["step"]] += r["bytes_sent"]
    return sum(steps.values()) / max(len(steps), 1)


def plot(intra: list[dict], inter: list[dict], out: Path) -> Path:
    """Discriminator loss of the intra- and inter-cluster runs on one PNG (Figure 8)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    if intra:
        ax.plot([r["step"] for r in intra], [r["loss"] for r in intra], label="intra-cluster", color="tab:blue",
                lw=3.5, alpha=0.45)  # wide and pale: the inter-cluster curve lies on top of it where both ran
    if inter:
        ax.plot([r["step"] for r in inter], [r["loss"] for r in inter], label="inter-cluster (hot start)",
                color="tab:orange")
        ax.axvline(inter[0]["step"], color="grey", lw=0.8, ls="--")
    ax.set_xlabel("step")
    ax.set_ylabel("discriminator loss (50 RTD + CLM)")
    ax.set_title("ELECTRA Scenario I: hot start from the intra-cluster checkpoint")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _mean(recs: list[dict], key: str) -> float:
    return sum(r[key] for r in recs) / max(len(recs), 1)


def _per_micro_batch(rec: dict, key: str) -> float:
    """A loss the discriminator summed over its micro-batches of the step, as a mean."""
    return rec.get(key, float("nan")) / max(rec.get("micro_batches", 1.0), 1.0)


def summarise(run: Path, generators: list[str], discriminator: str = "D", last: int = 20) -> dict:
    """Everything the summary prints, as a dict."""
    run = Path(run)
    disc = _read(run / "metrics" / f"{discriminator}.rank0.jsonl")
    subs = [_read(f) for f in sorted((run / "metrics").glob(f"{discriminator}.rank*.jsonl"))]
    intra = _read(run / "metrics_intra" / f"{discriminator}.rank0.jsonl")
    if not disc:
        raise FileNotFoundError(f"{run}/metrics/{discriminator}.rank0.jsonl is empty or missing: the run did not train")
    tail = [r for recs in subs for r in recs[-last:]]
    out = {
        "steps": [disc[0]["step"], disc[-1]["step"]],
        "disc_loss": [_mean(disc[:10], "loss"), _mean(disc[-10:], "loss")],
        "intra_loss_from_scratch": [_mean(intra[:10], "loss"), _mean(intra[-10:], "loss")] if intra else None,
        "rtd_loss": [_per_micro_batch(disc[0], "rtd_loss"), _per_micro_batch(disc[-1], "rtd_loss")],
        "clm_loss": [_per_micro_batch(disc[0], "clm_loss"), _per_micro_batch(disc[-1], "clm_loss")],
        "gen_loss": {g: [_mean(recs[:10], "loss"), _mean(recs[-10:], "loss")] for g in generators
                     if (recs := _read(run / "metrics" / f"{g}.rank0.jsonl"))},
        "per_language": per_language(tail),
        "wan_bytes_per_step": wan_bytes_per_step(run, generators + [discriminator]),
        "k": disc[-1].get("k"),
    }
    if intra:
        at = {r["step"]: r["loss"] for r in intra}
        s0 = disc[0]["step"]
        out["hot_start"] = {"step": s0, "intra_loss": at.get(s0), "inter_loss": disc[0]["loss"]}
        out["plot"] = str(plot(intra, disc, run / "loss.png"))
    return out


def main(argv: list[str] | None = None) -> int:
    """Print the summary of RUN and write RUN/summary.json."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--progress"] and len(argv) == 3:
        f = "{:.3f}".format
        for row in progress(_read(Path(argv[1])), [int(x) for x in argv[2].split(",")]):
            pairs = "" if row["replaced_recall_pairs"] is None else \
                f"  pairs: replaced recall {f(row['replaced_recall_pairs'])}, CLM acc {f(row['clm_acc_pairs'])}"
            print(f"steps {row['steps'][0]}-{row['steps'][1]}: RTD loss {f(row['rtd_loss'])}  monolingual: replaced "
                  f"recall {f(row['replaced_recall_mono'])}, CLM acc {f(row['clm_acc_mono'])}{pairs}")
        return 0
    if not argv:
        print("usage: python -m recipes.electra.summary RUN [GEN_CLUSTERS=G1,G2] [DISC=D] | --progress METRICS "
              "STEP,STEP,...", file=sys.stderr)
        return 2
    run = Path(argv[0])
    # no generators ("", as the discriminator's site gives: their files are on their own sites): its side alone
    gens = [g for g in (argv[1] if len(argv) > 1 else "G1,G2").split(",") if g]
    s = summarise(run, gens, argv[2] if len(argv) > 2 else "D")
    (run / "summary.json").write_text(json.dumps(s, indent=1))
    print(scalars_note(run / "metrics", run / "vdl"))
    a, b = s["steps"]
    print(f"steps {a}..{b} (k={s['k']})")
    if s["intra_loss_from_scratch"]:
        x, y = s["intra_loss_from_scratch"]
        print(f"intra-cluster discriminator loss (first 10 -> last 10 steps, from scratch): {x:.3f} -> {y:.3f}")
    print(f"inter-cluster discriminator loss (first 10 -> last 10 steps) {s['disc_loss'][0]:.3f} -> "
          f"{s['disc_loss'][1]:.3f}  (first -> last step: RTD {s['rtd_loss'][0]:.3f} -> {s['rtd_loss'][1]:.3f}, "
          f"CLM {s['clm_loss'][0]:.3f} -> {s['clm_loss'][1]:.3f})")
    for g, (x, y) in s["gen_loss"].items():
        print(f"generator {g} MLM loss (first 10 -> last 10 steps) {x:.3f} -> {y:.3f}")
    print(f"{'language':<10}{'RTD acc':>9}{'replaced recall':>17}{'CLM acc':>9}{'tokens':>9}   (last 20 steps)")
    for lang, v in s["per_language"].items():
        print(f"{lang:<10}{v['rtd_acc']:>9.3f}{v['replaced_recall']:>17.3f}{v['clm_acc']:>9.3f}{v['tokens']:>9.0f}")
    who = "all clusters" if gens else f"cluster {argv[2] if len(argv) > 2 else 'D'}"
    print(f"WAN bytes per step ({who}, sent): {s['wan_bytes_per_step']:.0f}")
    if "hot_start" in s:
        h = s["hot_start"]
        print(f"hot start at step {h['step']}: intra loss {h['intra_loss']}, inter loss {h['inter_loss']:.4f}")
        print(f"plot: {s['plot']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
