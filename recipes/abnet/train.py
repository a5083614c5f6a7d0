"""Single-process ABNet fine-tuning and evaluation (both halves in one process: the reference for the two-cluster run)."""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

import paddle

from nebula import smoke
from nebula.progress import Progress

from .sides import DecoderSide, EncoderSide, TrainConfig, eval_ids, load_train_config, step_batch

__all__ = ["train_single", "evaluate_bleu", "main"]

log = logging.getLogger(__name__)


@paddle.no_grad()
def evaluate_bleu(enc: EncoderSide, dec: DecoderSide, ids: Sequence[str], batch: int) -> tuple[float, list[str]]:
    """BLEU and hypotheses of the current model on the given example ids."""
    enc.model.eval()
    hyps: list[str] = []
    for s in range(0, len(ids), batch):
        hyps += dec.translate(enc.forward(ids[s : s + batch]))
    enc.model.train()
    return dec.score(hyps, ids), hyps


def train_single(cfg: TrainConfig, encoder_data: str | Path, decoder_data: str | Path, work_dir: str | Path,
                 show_progress: bool = True, on_step: Callable[[int, float], None] | None = None) -> dict:
    """Pretrain (or load) both bases, fine-tune the adapters, report BLEU before/after; returns a summary dict."""
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    enc = EncoderSide(encoder_data, work, cfg)
    dec = DecoderSide(decoder_data, work, cfg, source_hidden=enc.model_cfg.source.hidden)
    train_ids = enc.ids["train"]
    if sorted(train_ids) != sorted(dec.ids["train"]):
        raise ValueError("the two sides' training ids differ; both clusters must come from the same prepare_data run")
    test = eval_ids(dec)
    bleu0, hyps0 = evaluate_bleu(enc, dec, test, cfg.eval_batch)
    losses: list[float] = []
    t0 = time.time()
    bar = Progress(cfg.steps, "train", stream=sys.stderr) if show_progress else None
    for step in range(cfg.steps):
        ids = step_batch(train_ids, step, cfg.batch_size, cfg.seed)
        h = enc.forward(ids)
        loss = dec.loss(h, ids)
        loss.backward()
        for side in (enc, dec):
            side.optimizer.step()
            side.optimizer.clear_grad()
            side.lr.step()
        losses.append(float(loss))
        if on_step:
            on_step(step, losses[-1])
        if bar is not None:
            bar.update(1, loss=f"{losses[-1]:.3f}")
    if bar is not None:
        bar.close()
    train_s = time.time() - t0
    bleu1, hyps1 = evaluate_bleu(enc, dec, test, cfg.eval_batch)
    summary = {
        "bleu_before": bleu0, "bleu_after": bleu1, "steps": cfg.steps, "steps_per_s": cfg.steps / max(train_s, 1e-9),
        "losses": losses,
        "samples": [{"src": enc.text[i], "ref": dec.text[i], "before": a, "after": b}
                    for i, a, b in list(zip(test, hyps0, hyps1))[:8]],
    }
    (work / "summary_single.json").write_text(json.dumps(summary, ensure_ascii=False, indent=1))
    return summary


def main(argv: list[str] | None = None) -> int:
    """CLI: python -m recipes.abnet.train --encoder-data A --decoder-data B --work W [--config F] [--steps N]."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--encoder-data", required=True)
    p.add_argument("--decoder-data", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--config", default=None, help="TrainConfig YAML (recipes/abnet/configs/*.yaml)")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--pair", default=None)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        cfg = load_train_config(args.config, steps=args.steps, pair=args.pair) if args.config else \
            TrainConfig().replace(**{k: v for k, v in (("steps", args.steps), ("pair", args.pair)) if v is not None})
    except ValueError as exc:  # ConfigError (the file's line) or a bad --steps/--pair
        print(f"error: {exc}", file=sys.stderr)
        return 2
    # NEBULA_SMOKE: the smallest size (how CI runs the printed commands); a printed --steps 6000 shrinks too
    cfg = cfg.replace(steps=int(smoke.cap(cfg.steps, 20)), pretrain_steps=int(smoke.cap(cfg.pretrain_steps, 20)))
    s = train_single(cfg, args.encoder_data, args.decoder_data, args.work)
    print(f"BLEU before {s['bleu_before']:.2f} after {s['bleu_after']:.2f}; {s['steps_per_s']:.1f} steps/s")
    for x in s["samples"]:
        print(f"  {x['src']}\n    ref:    {x['ref']}\n    before: {x['before']}\n    after:  {x['after']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
