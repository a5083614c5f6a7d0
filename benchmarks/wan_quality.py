"""Quality per WAN byte: held-out loss against WAN bytes for every cross-cluster mode, same model, same tokens.

One invocation builds the corpus (Python documentation, manual pages and gettext catalogs of Debian packages it
installs: `recipes.text.corpus`), trains a byte-level BPE tokenizer on its train split and a PaddleFormers Llama
from it (`recipes.llm.prepare.save_tiny`, the `nebula.formers` path), then trains that model in every row of
`nebula.quality.engine` at a fixed compute budget (the same steps, batch and tokens, seed and data order for
every row) and prints one table: parameters, tokens, steps; held-out loss, its difference from the one-cluster
baseline (and the baseline's noise: the same row with a second seed), perplexity; WAN bytes and their ratio to
all-reduce's; wall time here (the clusters in one process) and the wall time each link would give (10, 100, 1000
Mbit/s with 20 ms RTT; `nebula.plan.link` from each row's measured critical-path compute and traffic). Rows run two
at a time in worker processes with one thread each (CPU Paddle trains these sizes faster so).

    .venv/bin/python benchmarks/wan_quality.py --quick --json rows.json   # every mode at a small size, <= 10 min
    .venv/bin/python benchmarks/wan_quality.py --json rows.json           # the full table (~2 h on 2 cores)
    .venv/bin/python benchmarks/wan_quality.py --scale --from rows.json   # the largest model: baseline, best rows
    .venv/bin/python benchmarks/wan_quality.py --real                     # two rows through real switches
    .venv/bin/python benchmarks/wan_quality.py --rows streaming --add-to rows.json --json rows.json   # rows added
    .venv/bin/python benchmarks/wan_quality.py --report rows.json more.json   # earlier runs' table, headline, plot

`--real` checks the one-process rows against the runtime: a DiLoCo row and a pipeline row (int8) at the quick size
through two real switch servers (`nebula launch` per cluster, TLS between them; benchmarks/_wanq_real.py), beside
the same rows of the engine (held-out loss and WAN bytes must agree), then through the link shaped to 10 and 100
Mbit/s with 20 ms RTT, beside the wall time `nebula.plan.link` predicts from the unshaped run's wall time (the
compute, relays included) and the row's traffic (the shaper's burst counted: it is the emulator's, not the link's).

`--json FILE` writes the rows (keys mode, codec, sync_every, stale_weights, heldout_loss, perplexity, wan_bytes,
wall_s, compute_s, ...); OUT/wan_quality.png plots held-out loss against WAN bytes (log) and against the wall time
on each link.
"""
from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).absolute().parent.parent  # (not resolved: a checkout linked elsewhere writes its own runs/)
LINKS = ("10mbit,20ms", "100mbit,20ms", "1000mbit,20ms")


@dataclass(frozen=True)
class Size:
    """The model and the compute budget of one run of the table."""

    hidden: int
    layers: int
    vocab: int
    heads: int
    kv_heads: int
    steps: int
    global_batch: int
    seq_len: int
    max_chars: int
    heldout_examples: int
    intervals: tuple[int, ...]


SIZES = {
    "quick": Size(hidden=64, layers=2, vocab=1024, heads=4, kv_heads=2, steps=200, global_batch=8, seq_len=64,
                  max_chars=1_500_000, heldout_examples=300, intervals=(10, 50)),
    "full": Size(hidden=128, layers=3, vocab=4096, heads=4, kv_heads=2, steps=2000, global_batch=8, seq_len=64,
                 max_chars=6_000_000, heldout_examples=2000, intervals=(10, 50, 100)),
    "scale": Size(hidden=256, layers=8, vocab=8192, heads=8, kv_heads=4, steps=2000, global_batch=8, seq_len=64,
                  max_chars=6_000_000, heldout_examples=2000, intervals=(10, 50, 100)),
}


def smallest(size: Size) -> Size:
    """`size` at the smallest that still runs every row of it (NEBULA_SMOKE: how CI runs the printed commands): a
    tiny Llama for 20 steps on a small corpus; the intervals, and so the rows' names, stay (each syncs at least at
    the last step)."""
    return replace(size, hidden=32, layers=2, vocab=512, heads=2, kv_heads=1, steps=min(size.steps, 20),
                   global_batch=4, seq_len=32, max_chars=200_000, heldout_examples=20)


DELTA_EPOCHS = 4
HUFFMAN = ("huffman(int4_block)",)
HUFFMAN_VARIANTS = ("huffman(fp4(block=64))", "huffman(int8)")
# (forward, backward): the fewest bytes within 1% of the uncompressed pipeline at the full size (delta.json), 3-bit
# deltas Huffman-coded (the cache sized to hold every example), and beside it the same 4-bit codes as its first
# sight and its gradients with no cache at all
DELTA_BEST = ("delta(huffman(int3_block), first=huffman(int4_block), cache_mb={mb})", "huffman(int4_block)")
DELTAS = ((DELTA_BEST[0].format(mb=160), DELTA_BEST[1]), ("huffman(int4_block)", "huffman(int4_block)"))
# the way there: the cache's default 64 MiB holds about half the full size's 4,000 examples (32 KiB each), so there,
# seen in the same order each epoch, every one is evicted before it comes back; 160 MiB holds them all; 2-bit deltas
# have no zero level (each code is off by a third of its block's largest delta); 4-bit ones cost 4-bit bytes
DELTA_VARIANTS = (
    ("delta(int2_block, first=int4_block)", "int4_block"), ("delta(int2_block, first=int8_block)", "int4_block"),
    ("delta(int2_block, first=int4_block, cache_mb=160)", "int4_block"),
    ("delta(huffman(int2_block), first=huffman(int4_block), cache_mb=160)", "huffman(int4_block)"),
    ("delta(huffman(int4_block), first=huffman(int4_block), cache_mb=160)", "huffman(int4_block)"),
    ("delta(huffman(int4_block(block=128)), first=huffman(int4_block), cache_mb=160)",
     "huffman(int4_block(block=128))"))


def rows_for(size: Size, quick: bool, variants: bool = False) -> list[Any]:
    """The rows of a run: baseline (two seeds), all-reduce, pipeline codecs x stale weights, DiLoCo intervals x
    outer codecs, the frontier methods (low-bit outer gradients, Streaming DiLoCo, activation deltas), FedAvg; with
    `variants`, also the variants measured on the way to the frontier rows (what `--rows` picks from)."""
    from nebula.quality.rows import RowSpec

    out = [RowSpec("one-cluster"), RowSpec("all-reduce")]
    codecs = ("none", "int8") if quick else ("none", "fp16", "int8", "int4_block")
    out += [RowSpec("pipeline", codec=c, stale_weights=n) for c in codecs for n in (0, 1)]
    outer = ("none", "int4_block") if quick else ("none", "int8", "int4_block")
    out += [RowSpec("diloco", codec=c, sync_every=h) for h in size.intervals for c in outer]
    h = size.intervals[-1]
    if not quick:  # the low-bit outer gradients of today's papers at the longest interval, 4-bit codes Huffman-coded
        # (lossless: the same loss as without, fewer bytes)
        out += [RowSpec("diloco", codec=c, sync_every=h)
                for c in ("fp4", "ef(topk2(0.05))", *HUFFMAN, *(HUFFMAN_VARIANTS if variants else ()))]
    # streaming at the longest interval, a fragment per quarter of the model, overlapped
    out += [RowSpec("streaming-diloco", codec=c, sync_every=h, fragments=4, delay=1) for c in ("none", "int4_block")]
    out.append(RowSpec("federated", sync_every=size.intervals[0]))
    # activation deltas (AQ-SGD) pay on examples seen again: DELTA_EPOCHS passes over a smaller training set, beside
    # the uncompressed pipeline on the same data
    out.append(RowSpec("pipeline", epochs=DELTA_EPOCHS))
    out += [RowSpec("pipeline", codec=c, grad_codec=g, epochs=DELTA_EPOCHS)
            for c, g in (*DELTAS, *(DELTA_VARIANTS if variants else ()))]
    return out


def frontier_rows(size: Size) -> list[Any]:
    """The frontier methods beside their references, at `size` (what --scale adds to the best row of each mode):
    DiLoCo at the longest interval with int8 and with 4-bit Huffman-coded outer gradients (the reference of both
    the low-bit codes and Streaming DiLoCo), and the uncompressed pipeline beside the best activation deltas on the
    same data, their cache sized to hold every example's activations at this size."""
    from nebula.quality.rows import RowSpec

    h = size.intervals[-1]
    examples = size.steps * size.global_batch // DELTA_EPOCHS
    need_mb = examples * size.seq_len * size.hidden * 4 / (1 << 20)  # float32 activations at the cut
    mb = 32 * math.ceil(need_mb * 1.25 / 32)  # (the cache's entries carry a little bookkeeping)
    fwd, grad = DELTA_BEST
    return [RowSpec("diloco", codec="int8", sync_every=h), RowSpec("diloco", codec="huffman(int4_block)", sync_every=h),
            RowSpec("pipeline", epochs=DELTA_EPOCHS),
            RowSpec("pipeline", codec=fwd.format(mb=mb), grad_codec=grad, epochs=DELTA_EPOCHS)]


# -- data and model -----------------------------------------------------------------------------------------------
def prepare(out: Path, size: Size, *, install: bool) -> tuple[Path, Path, Path]:
    """(model dir, train.txt, heldout.txt): the corpus (reused when built before) and a fresh Llama of `size` with a
    tokenizer trained on the train split."""
    from recipes.llm.prepare import save_tiny
    from recipes.text.corpus import build_corpus

    info = build_corpus(out / f"corpus-{size.max_chars // 1000}k", max_chars=size.max_chars, min_heldout_lines=size.heldout_examples,
                        install=install)
    print(f"corpus: {info.train_lines:,} train lines ({info.train_chars:,} chars), {info.heldout_lines:,} held-out "
          f"lines; documents per source: {info.sources}", flush=True)
    model = out / f"llama-h{size.hidden}-l{size.layers}-v{size.vocab}"
    if not (model / "config.json").is_file():
        lines = info.train.read_text(encoding="utf-8").splitlines()
        save_tiny(model, lines, hidden=size.hidden, layers=size.layers, heads=size.heads, kv_heads=size.kv_heads,
                  intermediate=size.hidden * 11 // 4 // 8 * 8, vocab_size=size.vocab, max_positions=size.seq_len)
    return model, info.train, info.heldout


# -- workers --------------------------------------------------------------------------------------------------------
_BENCH: Any = None
_QUEUE: Any = None


def _init(model: str, train: str, heldout: str, seq_len: int, lr: float, heldout_examples: int, queue: Any) -> None:
    global _BENCH, _QUEUE
    os.environ["OMP_NUM_THREADS"] = "1"
    from nebula.quality.engine import Bench

    _BENCH = Bench(model, train, heldout, seq_len=seq_len, lr=lr, heldout_examples=heldout_examples)
    _QUEUE = queue


def _work(job: tuple[Any, Any]) -> dict[str, Any]:
    spec, budget = job
    every = max(1, budget.steps // 100)

    def progress(done: int, total: int) -> None:
        if done % every == 0 or done == total:
            _QUEUE.put((spec.name, budget.seed, done, total))

    return _BENCH.run(spec, budget, progress).to_json()


class _Progress:
    """One status line redrawn on a terminal (otherwise a line per finished row and per 10% of the rows)."""

    def __init__(self, total_rows: int) -> None:
        self.tty = sys.stdout.isatty()
        self.total_rows, self.done_rows = total_rows, 0
        self.active: dict[tuple, tuple[int, int]] = {}
        self.t0 = time.monotonic()
        self._last_decile = -1

    def update(self, name: str, seed: int, done: int, total: int) -> None:
        self.active[(name, seed)] = (done, total)
        if done == total:
            self.active.pop((name, seed))
            self.done_rows += 1
            if not self.tty:  # a line per finished row: a log shows how far the run is
                print(f"row done: {name}{'' if seed == 1 else f' (seed {seed})'} at {time.monotonic() - self.t0:,.0f} s",
                      flush=True)
        bars = "  ".join(f"{n}{'' if s == 1 else f' seed {s}'} [{'#' * (10 * d // t):<10}] {d}/{t}"
                         for (n, s), (d, t) in self.active.items())
        line = f"rows {self.done_rows}/{self.total_rows}, {time.monotonic() - self.t0:5.0f} s  {bars}"
        if self.tty:
            print("\r" + line[:160].ljust(160), end="", flush=True)
        else:
            decile = (10 * self.done_rows) // self.total_rows
            if decile != self._last_decile:
                self._last_decile = decile
                print(line, flush=True)

    def close(self) -> None:
        if self.tty:
            print(flush=True)


def run_rows(model: Path, train: Path, heldout: Path, jobs: list[tuple[Any, Any]], *, workers: int,
             heldout_examples: int, done: Any = None) -> list[Any]:
    """Run `jobs` ((RowSpec, Budget) pairs) in `workers` processes; RowResults in the order given. `done(row)` is
    called with each row as it finishes (the benchmark saves it at once: a long run stopped keeps its rows)."""
    from nebula.quality.rows import RowResult

    b = jobs[0][1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    bar = _Progress(len(jobs))
    results: dict[int, Any] = {}
    with ctx.Pool(workers, initializer=_init, initargs=(str(model), str(train), str(heldout), b.seq_len, b.lr,
                                                         heldout_examples, queue)) as pool:
        pending = pool.imap_unordered(_work_indexed, list(enumerate(jobs)), chunksize=1)
        while len(results) < len(jobs):
            try:
                i, row = pending.next(timeout=0.5)
            except mp.TimeoutError:
                i = None
            while not queue.empty():
                bar.update(*queue.get())
            if i is not None:
                results[i] = RowResult.from_json(row)
                if done:
                    done(results[i])
    bar.close()
    return [results[i] for i in range(len(jobs))]


def _work_indexed(job: tuple[int, tuple[Any, Any]]) -> tuple[int, dict[str, Any]]:
    return job[0], _work(job[1])


# -- reporting ------------------------------------------------------------------------------------------------------
def table(rows: list[Any], noise: float | None) -> str:
    """The markdown table of a run (the baseline first; ratios against all-reduce's bytes)."""
    from nebula.plan.link import parse_link, predicted_wall_s

    base = next(r for r in rows if r.spec.mode == "one-cluster" and r.seed == rows[0].seed)
    ar = next((r for r in rows if r.spec.mode == "all-reduce"), None)
    links = [parse_link(x) for x in LINKS]
    head = ("| row | params | tokens | steps | held-out loss | vs baseline | ppl | WAN bytes | x fewer than all-reduce "
            "| wall here s | " + " | ".join(f"wall s @ {lk.mbit:g} Mbit/s" for lk in links) + " |")
    lines = [head, "|" + "---|" * (10 + len(links))]
    for r in rows:
        rel = (r.heldout_loss / base.heldout_loss - 1) * 100
        fewer = f"{ar.wan_bytes / r.wan_bytes:,.0f}" if ar and r.wan_bytes else "-"
        walls = " | ".join(f"{predicted_wall_s(r.compute_s, r.traffic, lk):,.0f}" for lk in links)
        name = r.spec.name + ("" if r.seed == base.seed else f" (seed {r.seed})")
        lines.append(f"| {name} | {r.params:,} | {r.tokens:,} | {r.steps:,} | {r.heldout_loss:.4f} | {rel:+.2f}% | "
                     f"{r.perplexity:.1f} | {r.wan_bytes:,} | {fewer} | {r.wall_s:,.0f} | {walls} |")
    if noise is not None:
        lines.append(f"\nBaseline noise (two data-order seeds): {noise:.2f}% of the held-out loss.")
    return "\n".join(lines)


def headline(rows: list[Any]) -> str:
    """The baseline against the best row of each mode (`best_of_each_mode`): held-out loss, its difference, WAN bytes
    and how many times fewer than all-reduce's, wall time per link."""
    from nebula.plan.link import parse_link, predicted_wall_s

    links = [parse_link(x) for x in LINKS]
    base = next(r for r in rows if r.spec.mode == "one-cluster")
    ar = next((r for r in rows if r.spec.mode == "all-reduce"), None)
    best = {spec: next(r for r in rows if r.spec == spec and r.seed == base.seed) for spec in best_of_each_mode(rows)}
    lines = ["| mode (best row) | held-out loss | vs one cluster | WAN bytes | x fewer than all-reduce | "
             + " | ".join(f"wall s @ {lk.mbit:g} Mbit/s" for lk in links) + " |", "|" + "---|" * (5 + len(links))]
    for r in best.values():
        fewer = f"{ar.wan_bytes / r.wan_bytes:,.0f}" if ar and r.wan_bytes else "-"
        walls = " | ".join(f"{predicted_wall_s(r.compute_s, r.traffic, lk):,.0f}" for lk in links)
        lines.append(f"| {r.spec.name} | {r.heldout_loss:.4f} | {(r.heldout_loss / base.heldout_loss - 1) * 100:+.2f}% | "
                     f"{r.wan_bytes:,} | {fewer} | {walls} |")
    return "\n".join(lines)


def plot(rows: list[Any], out: Path) -> Path:
    """Held-out loss against WAN bytes (log) and against the wall time each link would give."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from nebula.plan.link import parse_link, predicted_wall_s

    links = [parse_link(x) for x in LINKS]
    fig, axes = plt.subplots(1, 1 + len(links), figsize=(5 * (1 + len(links)), 4.5))
    marks = {"one-cluster": "*", "all-reduce": "s", "pipeline": "^", "diloco": "o", "streaming-diloco": "P",
             "federated": "D"}
    for r in rows:
        kw = {"marker": marks[r.spec.mode], "label": r.spec.name + ("" if r.seed == 1 else f" (seed {r.seed})")}
        if r.wan_bytes:
            axes[0].scatter(r.wan_bytes, r.heldout_loss, **kw)
        else:  # no WAN: the baseline is a level to compare with, not a point on the bytes axis
            axes[0].axhline(r.heldout_loss, ls="--", lw=0.8, color="grey")
        for ax, lk in zip(axes[1:], links):
            ax.scatter(predicted_wall_s(r.compute_s, r.traffic, lk), r.heldout_loss, **kw)
    axes[0].set_xscale("log")
    axes[0].set_xlabel("WAN bytes (log); dashed: one cluster, no WAN")
    for ax, lk in zip(axes[1:], links):
        ax.set_xscale("log")
        ax.set_xlabel(f"wall time s on {lk}")
    for ax in axes:
        ax.set_ylabel("held-out loss")
        ax.grid(alpha=0.3)
    axes[-1].legend(fontsize=6, loc="upper right")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def best_of_each_mode(rows: list[Any]) -> list[Any]:
    """The baseline and, per mode, the row with the lowest held-out loss per WAN byte that stays within 2% of the
    baseline (else the lowest loss)."""
    base = next(r for r in rows if r.spec.mode == "one-cluster")
    out = [base.spec]
    for mode in ("all-reduce", "pipeline", "diloco", "streaming-diloco", "federated"):
        cand = [r for r in rows if r.spec.mode == mode and not r.spec.epochs]  # (epochs rows: other data)
        if not cand:
            continue
        ok = [r for r in cand if r.heldout_loss <= base.heldout_loss * 1.02]
        pick = min(ok, key=lambda r: r.wan_bytes) if ok else min(cand, key=lambda r: r.heldout_loss)
        out.append(pick.spec)
    return out


def real_check(out: Path, size: Size, *, steps: int, lr: float, rates: tuple[float, ...] = (10.0, 100.0),
               rtt_ms: float = 20.0) -> str:
    """Two rows through real switches against the engine's, and shaped-link wall times against the link model's;
    the two tables as markdown."""
    from _wanq_real import run_real  # benchmarks/ (this script's directory): the real runs' harness

    from nebula.plan.link import WanLink, predicted_wall_s
    from nebula.quality.engine import Bench, Budget
    from nebula.quality.rows import RowSpec
    from switch_server.shaper import TokenBucket

    model, train, heldout = prepare(out, size, install=False)
    budget = Budget(steps=steps, global_batch=size.global_batch, seq_len=size.seq_len, lr=lr)
    bench = Bench(model, train, heldout, seq_len=size.seq_len, lr=lr, heldout_examples=size.heldout_examples)
    specs = [RowSpec("diloco", codec="int8", sync_every=10), RowSpec("pipeline", codec="int8")]
    agree = ["| row | held-out loss, one process | held-out loss, real switches | WAN bytes, one process | "
             "WAN bytes, real switches |", "|---|---|---|---|---|"]
    walls = ["| row | link | wall s measured | wall s predicted | predicted / measured |", "|---|---|---|---|---|"]
    for spec in specs:
        sim = bench.run(spec, budget)
        kw = dict(model_dir=model, train=train, heldout=heldout, steps=steps, global_batch=size.global_batch,
                  seq_len=size.seq_len, lr=lr, seed=budget.seed, workdir=out / "real",
                  heldout_examples=size.heldout_examples)
        base = run_real(spec, rate_mbit=None, delay_ms=0.0, **kw)
        agree.append(f"| {spec.name} | {sim.heldout_loss:.6f} | {base.heldout_loss:.6f} | {sim.wan_bytes:,} | "
                     f"{base.wan_bytes:,} ({base.wan_bytes / sim.wan_bytes - 1:+.2%}) |")
        walls.append(f"| {spec.name} | unshaped | {base.wall_s:.2f} | - | - |")
        for rate in rates:
            shaped = run_real(spec, rate_mbit=rate, delay_ms=rtt_ms / 2, **kw)
            link = WanLink(rate, rtt_ms, burst_bytes=TokenBucket(rate).burst)
            pred = predicted_wall_s(base.wall_s, sim.traffic, link)
            walls.append(f"| {spec.name} | {link} | {shaped.wall_s:.2f} | {pred:.2f} | {pred / shaped.wall_s:.2f} |")
            print(walls[-1], flush=True)
    return "\n".join(agree) + "\n\n" + "\n".join(walls)


def merge_rows(runs: list[list[Any]]) -> list[Any]:
    """The rows of several runs of one size in order, a row (spec and seed) of a later run replacing an earlier's;
    SystemExit when their sizes differ."""
    first = next(r for run in runs for r in run)
    out: dict[tuple, Any] = {}
    for run in runs:
        for r in run:
            if (r.steps, r.tokens, r.params) != (first.steps, first.tokens, first.params):
                raise SystemExit(f"rows of different sizes: {r.spec.name} trained {r.params:,} parameters for "
                                 f"{r.steps} steps, {first.spec.name} {first.params:,} for {first.steps}; merge "
                                 "runs made with the same size options")
            out[(r.spec, r.seed)] = r
    return list(out.values())


def report(rows: list[Any], out: Path) -> str:
    """The full table with the baseline's noise, the headline (best row of each mode) and where the plot went."""
    bases = [r.heldout_loss for r in rows if r.spec.mode == "one-cluster"]
    noise = (max(bases) / min(bases) - 1) * 100 if len(bases) > 1 else None
    deltas = delta_table(rows)
    if deltas:
        deltas = f"Activation deltas against the uncompressed pipeline on the same data:\n\n{deltas}\n\n"
    return (f"{table(rows, noise)}\n\nBest row of each mode (the fewest WAN bytes within 2% of one cluster's held-out "
            f"loss, else the lowest loss):\n\n{headline(rows)}\n\n{deltas}plot: {plot(rows, out / 'wan_quality.png')}")


def delta_table(rows: list[Any]) -> str:
    """Each pipeline row of a smaller training set seen several times (`epochs`) against the uncompressed pipeline
    on the same data: held-out loss, its difference, pipeline bytes and how many times fewer, each end's cache."""
    lines = []
    for r in rows:
        if r.spec.mode != "pipeline" or not r.spec.epochs or r.spec.codec == "none" and not r.spec.grad_codec:
            continue
        twin = next((t for t in rows if t.spec == replace(r.spec, codec="none", grad_codec="") and t.seed == r.seed),
                    None)
        if twin is None or not r.wan_bytes:
            continue
        cache = r.extra.get("cache_bytes", 0)
        lines.append(f"| {r.spec.name} | {r.heldout_loss:.4f} | {(r.heldout_loss / twin.heldout_loss - 1) * 100:+.2f}% "
                     f"| {r.wan_bytes:,} | {twin.wan_bytes / r.wan_bytes:.1f} | {cache / 2 ** 20:.1f} MiB |")
    head = ["| row | held-out loss | vs pipeline none | WAN bytes | x fewer than none | cache per end |",
            "|---|---|---|---|---|---|"]
    return "\n".join(head + lines) if lines else ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="every mode at a small size (about 10 minutes here)")
    ap.add_argument("--scale", action="store_true",
                    help="the largest model (>= 10M parameters): the baseline, the best row of each mode, and "
                         "the frontier methods beside their references (frontier_rows)")
    ap.add_argument("--from", dest="source", type=Path,
                    help="with --scale: the rows JSON of a full run, to pick the best row of each mode from")
    ap.add_argument("--json", type=Path, help="write the rows to this file (a JSON list)")
    ap.add_argument("--out", type=Path, default=REPO / "runs" / "wan_quality",
                    help="where the corpus, the model and the plot go (default runs/wan_quality)")
    ap.add_argument("--steps", type=int, help="optimizer steps per row (default: the size's)")
    ap.add_argument("--rows", help="only rows whose name contains one of these comma-separated words, run in that "
                                   "order (the baseline first), among the full run's rows and the variants measured "
                                   "on the way to its frontier rows")
    ap.add_argument("--add-to", type=Path, metavar="ROWS.json",
                    help="run only the --rows rows (no baseline) at the size of this earlier run's rows and print "
                         "them with its rows (written back with --json)")
    ap.add_argument("--workers", type=int, default=2, help="rows trained at once, one process each (default 2)")
    ap.add_argument("--seeds", type=int, default=2, help="baseline seeds, for the noise between them (default 2)")
    ap.add_argument("--lr", type=float, default=2e-3, help="inner learning rate (AdamW; default 0.002)")
    ap.add_argument("--outer-lr", type=float, default=0.7, help="DiLoCo's outer learning rate (default 0.7)")
    ap.add_argument("--outer-momentum", type=float, default=0.9,
                    help="DiLoCo's outer Nesterov momentum (default 0.9, the paper's; 0: none)")
    ap.add_argument("--no-install", action="store_true", help="do not apt-get the corpus's packages")
    ap.add_argument("--report", type=Path, nargs="+", metavar="ROWS.json",
                    help="print the table, the headline and the plot of earlier runs' rows (a row in a later file "
                         "replaces the same row of an earlier one; --json writes them together); train nothing")
    ap.add_argument("--resume", action="store_true",
                    help="with --json FILE: keep the rows a stopped run of this command saved there, run the others "
                         "(every row is saved as it finishes)")
    ap.add_argument("--real", action="store_true",
                    help="check two rows through real switches and the link model against a shaped link")
    ap.add_argument("--real-steps", type=int, default=60, help="steps of each --real run (default 60)")
    args = ap.parse_args(argv)

    from nebula import smoke
    from nebula.quality.engine import Budget
    from nebula.quality.rows import check_same_data, data_fingerprint, read_rows, write_rows

    size = SIZES["quick" if args.quick or args.real else "scale" if args.scale else "full"]
    if args.steps:
        size = replace(size, steps=args.steps)
    size = smoke.pick(size, smallest(size))
    if args.real:
        print(real_check(args.out, size, steps=args.real_steps, lr=args.lr))
        return 0
    if args.report:
        rows = merge_rows([read_rows(f) for f in args.report])
        try:
            check_same_data(rows)
        except ValueError as exc:
            raise SystemExit(f"--report: {exc}") from None
        print(report(rows, args.out))
        if args.json:  # with the first file's meta (the size the rows were measured at)
            first = json.loads(args.report[0].read_text(encoding="utf-8"))
            write_rows(args.json, rows, meta=first[0].get("meta") if first else None)
        return 0
    if args.scale:
        if not args.source:
            raise SystemExit("--scale needs --from ROWS.json (a full run's rows) to pick the best row of each mode")
        specs = best_of_each_mode(read_rows(args.source))
        specs += [s for s in frontier_rows(size) if s not in specs]
    else:
        specs = rows_for(size, args.quick, variants=bool(args.rows))
    earlier = read_rows(args.add_to) if args.add_to else []
    if args.resume:
        if not (args.json and args.json.is_file()):
            raise SystemExit("--resume needs --json FILE of a run stopped before (it keeps that file's rows and runs "
                             "the others)")
        earlier = read_rows(args.json)
        print(f"{args.json}: {len(earlier)} rows kept from the run stopped before", flush=True)
    if args.rows:  # (the baseline stays: it is dropped below when the earlier rows hold it)
        words = [w.strip() for w in args.rows.split(",") if w.strip()]
        specs = [s for s in specs if s.mode == "one-cluster" or any(w in s.name for w in words)]
        # in the order the words name them (the baseline first): what matters most runs first
        specs.sort(key=lambda s: -1 if s.mode == "one-cluster" else min(i for i, w in enumerate(words) if w in s.name))
    t0 = time.monotonic()
    model, train, heldout = prepare(args.out, size, install=not args.no_install)
    data = data_fingerprint(model, train, heldout)
    try:
        unknown = check_same_data(earlier, data)
    except ValueError as exc:
        raise SystemExit(f"{args.add_to or args.json}: {exc}") from None
    if unknown:
        print(f"note: {len(unknown)} earlier rows carry no data fingerprint (measured before it was kept); that they "
              f"share this run's corpus and model ({data}) cannot be checked", flush=True)
    budget = Budget(steps=size.steps, global_batch=size.global_batch, seq_len=size.seq_len, lr=args.lr,
                    outer_lr=args.outer_lr, outer_momentum=args.outer_momentum)
    jobs = [(s, budget) for s in specs]
    if not args.add_to:
        jobs += [(specs[0], replace(budget, seed=budget.seed + k)) for k in range(1, args.seeds)]
    planned = [(s, b.seed) for s, b in jobs]  # the order an uninterrupted run prints its rows in
    have = {(r.spec, r.seed) for r in earlier}
    jobs = [(s, b) for s, b in jobs if (s, b.seed) not in have]
    kept = list(earlier)
    meta = {"size": asdict(size), "lr": args.lr, "model": model.name, "data": data, "outer_lr": args.outer_lr,
            "outer_momentum": args.outer_momentum}

    def save(row: Any) -> None:
        kept.append(row)
        if args.json:  # after every row: a stopped run resumes from here
            write_rows(args.json, merge_rows([kept]), meta=meta)

    print(f"{len(jobs)} rows of {size.steps} steps x {size.global_batch} sequences x {size.seq_len} tokens "
          f"({budget.tokens:,} tokens each), {args.workers} at a time", flush=True)
    rows = run_rows(model, train, heldout, jobs, workers=args.workers, heldout_examples=size.heldout_examples,
                    done=save) if jobs else []
    if earlier:  # the earlier run's rows first (its baseline leads the table), a row run again replaced
        rows = merge_rows([earlier, rows])
    if args.resume:  # a resumed run prints what the run it finishes would have printed
        rank = {k: i for i, k in enumerate(planned)}
        rows.sort(key=lambda r: rank.get((r.spec, r.seed), len(rank)))
    print(report(rows, args.out))
    print(f"total {time.monotonic() - t0:,.0f} s")
    if args.json:
        write_rows(args.json, rows, meta=meta)
        print(f"rows: {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
