"""CLI: how many of ABNet's dev/test sentences (English or translation) are in ELECTRA's training split.

`python -m recipes.electra.overlap [--langs es] [--max-words 6 --vocab-top-k 300 --test-per-mille 100]` prepares
ABNet's data with those options in a temporary directory, builds the default ELECTRA corpus from the same catalogs
and prints the overlap per ABNet split: 0 everywhere means an ELECTRA base cannot have seen ABNet's evaluation text.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from recipes.text.catalogs import DataConfig
    from recipes.electra.data import CorpusConfig

__all__ = ["overlap", "main"]


def overlap(abnet_cfg: DataConfig, lang: str, locale_root: str, corpus_cfg: CorpusConfig) -> tuple[dict[str, tuple[int, int, int]], int]:
    """Per ABNet held-out split: (English sentences, of them in ELECTRA's training English, English or
    translation texts of that split found in ELECTRA's training text); and ELECTRA's training split size."""
    from recipes.text.catalogs import prepare_data, read_side
    from recipes.electra.data import build_corpus

    with tempfile.TemporaryDirectory(prefix="electra-overlap-") as tmp:
        d = Path(tmp)
        prepare_data(d / "A", d / "B", [lang], locale_root, abnet_cfg)
        held = {s: ({t.lower() for t in read_side(d / "A" / f"en-{lang}" / f"{s}.en.tsv")[1]},
                    {t.lower() for t in read_side(d / "B" / f"en-{lang}" / f"{s}.{lang}.tsv")[1]})
                for s in ("dev", "test")}
    train = build_corpus(corpus_cfg, locale_root)["train"]
    en = {e.en.lower() for e in train}
    texts = en | {e.text.lower() for e in train}
    return {s: (len(e), len(e & en), len((e | t) & texts)) for s, (e, t) in held.items()}, len(train)


def main(argv: list[str] | None = None) -> int:
    """Parse, measure, print one line per ABNet split; exit 1 when any overlap is found."""
    from recipes.text.catalogs import CatalogError, DataConfig
    from recipes.electra.data import DEFAULT_GROUPS, CorpusConfig, parse_groups

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--langs", default="es", help="ABNet's target language (one)")
    ap.add_argument("--max-words", type=int, default=6)
    ap.add_argument("--vocab-top-k", type=int, default=300)
    ap.add_argument("--test-per-mille", type=int, default=100, help="ABNet's --test-per-mille (dev the same)")
    ap.add_argument("--locale-dir", default="/usr/share/locale")
    ap.add_argument("--groups", default="", help="ELECTRA's groups, as for prepare (default: its default groups)")
    args = ap.parse_args(argv)
    try:
        groups = parse_groups(args.groups) if args.groups else dict(DEFAULT_GROUPS)
        abnet = DataConfig(max_words=args.max_words, vocab_top_k=args.vocab_top_k, test_per_mille=args.test_per_mille,
                           dev_per_mille=args.test_per_mille)
        found, n_train = overlap(abnet, args.langs, args.locale_dir, CorpusConfig(groups=groups))
    except (CatalogError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"ELECTRA training split: {n_train} messages")
    for split, (n, en, text) in found.items():
        print(f"ABNet {split}: {n} English sentences, {en} in ELECTRA's training English, {text} English or "
              "translation texts in ELECTRA's training text")
    return 1 if any(v[1] or v[2] for v in found.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
