"""CLI: extract the gettext pairs and give each cluster its side; optionally pretrain (or check) one side's base."""
from __future__ import annotations

import argparse
import logging
import sys

from recipes.text.catalogs import CatalogError, DataConfig, prepare_data

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """`python -m recipes.abnet.prepare data --encoder-out A --decoder-out B [--langs es,zh]` or
    `python -m recipes.abnet.prepare base --side encoder|decoder --data D --work W [--config F]`."""
    p = argparse.ArgumentParser(prog="python -m recipes.abnet.prepare", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("data", help="extract, clean, deduplicate and split; write each side to its cluster")
    d.add_argument("--encoder-out", required=True, help="cluster A's data directory (English + ids)")
    d.add_argument("--decoder-out", required=True, help="cluster B's data directory (target + ids)")
    d.add_argument("--langs", default="es", help="comma-separated target languages: es, zh")
    d.add_argument("--locale-dir", default="/usr/share/locale")
    d.add_argument("--max-words", type=int, default=8, help="longest English message kept, in words")
    d.add_argument("--vocab-top-k", type=int, default=0,
                   help="keep pairs made only of each side's K most frequent words (0: all)")
    d.add_argument("--test-per-mille", type=int, default=25, help="share of pairs in the test split (and dev)")
    b = sub.add_parser("base", help="pretrain (masked LM) or load one side's frozen base before training")
    b.add_argument("--side", choices=("encoder", "decoder"), required=True)
    b.add_argument("--data", required=True, help="this cluster's data directory")
    b.add_argument("--work", required=True, help="this cluster's work directory (base_<lang>/ goes here)")
    b.add_argument("--config", default=None, help="TrainConfig YAML")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if args.cmd == "data":
        try:
            counts = prepare_data(args.encoder_out, args.decoder_out, [x for x in args.langs.split(",") if x],
                                  args.locale_dir, DataConfig(max_words=args.max_words, vocab_top_k=args.vocab_top_k,
                                             test_per_mille=args.test_per_mille,
                                             dev_per_mille=args.test_per_mille))
        except (CatalogError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        for pair, c in counts.items():
            print(f"{pair}: train {c['train']}, dev {c['dev']}, test {c['test']}")
        return 0
    from nebula.config import ConfigError

    from .trainconfig import TrainConfig, load_train_config

    try:  # before Paddle is imported: a bad train.yaml is one line, at once
        cfg = load_train_config(args.config) if args.config else TrainConfig()
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from nebula.progress import Progress

    from .pretrain import PretrainedError
    from .sides import DecoderSide, EncoderSide
    from .model import preset

    bar = Progress(cfg.pretrain_steps, f"pretrain {args.side} base", stream=sys.stderr)

    def progress(step: int, loss: float) -> None:
        bar.update(1, loss=f"{loss:.3f}")

    try:
        if args.side == "encoder":
            side = EncoderSide(args.data, args.work, cfg, progress=progress)
        else:
            side = DecoderSide(args.data, args.work, cfg, preset(cfg.preset).source.hidden, progress=progress)
    except (PretrainedError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        bar.close()
    print(f"{args.side} base ready: {side.model_cfg.source if args.side == 'encoder' else side.model_cfg.target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
